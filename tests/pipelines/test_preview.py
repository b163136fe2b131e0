"""Structural previews: bounded, deterministic, and telling what was left out."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from pipelines.preview import is_error, preview


def test_json_array_shows_first_items_and_count() -> None:
    """An array shows its first items whole and says how many are not shown."""
    items = [{"flight": f"HAT{i:03d}", "price": 100 + i} for i in range(500)]
    text = preview(json.dumps(items), 1_000)
    lines = text.splitlines()
    assert lines[0].startswith("JSON array, showing ")
    shown = int(lines[0].split()[3])
    assert 5 < shown < 500
    assert lines[1] == '{"flight":"HAT000","price":100}'
    assert f"{500 - shown} more items not shown" in text
    assert "rather than guessing" in text


def test_json_object_shows_shape() -> None:
    """An object shows each key with a short value or a count."""
    value = {
        "user_id": "mia_li_3668",
        "reservations": ["A", "B", "C"],
        "address": {"city": "Austin", "zip": "78701"},
        "bio": "x" * 500,
    }
    text = preview(json.dumps(value), 2_000)
    assert '"user_id": "mia_li_3668"' in text
    assert '"reservations": array of 3 (str)' in text
    assert '"address": {"city": "Austin", "zip": "78701"}' in text
    assert len(text) < 600


def test_log_keeps_head_and_tail_with_line_numbers() -> None:
    """A long log shows its first and last lines and numbers the gap."""
    log = "\n".join(f"line {i}: step ok" for i in range(1, 5001))
    text = preview(log, 1_000)
    assert "5000 lines" in text
    assert "line 1: step ok" in text
    assert "line 5000: step ok" in text
    assert "not shown" in text


def test_error_keeps_its_cause() -> None:
    """An error report keeps its end, where the cause is, and is recognised as an error."""
    trace = (
        "Traceback (most recent call last):\n"
        + "\n".join(f'  File "app.py", line {i}, in f{i}' for i in range(2000))
        + "\nKeyError: 'reservation_id'"
    )
    assert is_error(trace)
    text = preview(trace, 1_000)
    assert text.startswith("Error output")
    assert text.endswith("KeyError: 'reservation_id'")
    assert not is_error("All 12 flights found.")


@given(st.text(max_size=5_000), st.integers(min_value=200, max_value=3_000))
def test_any_text_gives_a_bounded_deterministic_preview(text: str, budget: int) -> None:
    """Whatever the text, the preview is deterministic and stays near its budget."""
    first = preview(text, budget)
    assert first == preview(text, budget)
    assert len(first) <= budget + 400
