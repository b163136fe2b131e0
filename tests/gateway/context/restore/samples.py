"""Media shared by the restore tests: a PDF document block, a screenshot, and a
conversation whose PDF the media stage offloads."""

from __future__ import annotations

from typing import Any

PDF = "JVBERi0xLjQKJcfsj6IKMSAwIG9iago8PC9UeXBlL0NhdGFsb2cvUGFnZXMgMiAwIFI+PgplbmRvYmoK" * 20
DOCUMENT = {
    "type": "document",
    "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
    "title": "spec.pdf",
    "citations": {"enabled": True},
}
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5E"
    "rkJggg=="
)


def screenshot(text: str) -> dict[str, Any]:
    """A user message carrying an Anthropic-form image and ``text``."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    return {"role": "user", "content": [image, {"type": "text", "text": text}]}


def spec_and_screenshots() -> list[dict[str, Any]]:
    """A PDF in the first user message, then two newer screenshots: the media stage
    offloads the PDF (keep-images=2)."""
    return [
        {"role": "user", "content": [DOCUMENT, {"type": "text", "text": "Here is the spec."}]},
        {"role": "assistant", "content": "Got it."},
        screenshot("Screenshot 1."),
        {"role": "assistant", "content": "Ok."},
        screenshot("Screenshot 2; what did page 1 of the spec say?"),
    ]
