"""The tables the ``/v1/messages`` checks read (``sdk_tables.py``) are what the installed
anthropic SDK's request types say: a role, block kind or field the SDK learns on an
upgrade fails here until the tables are written again
(``python -m gateway.codecs.messages.derive``)."""

from __future__ import annotations

import subprocess
import sys

from gateway.codecs.messages import derive, sdk_tables


def test_the_written_tables_are_what_the_installed_sdk_defines() -> None:
    derived = derive.derived()
    written = {name: getattr(sdk_tables, name) for name in derived}
    assert written == derived


def test_the_tables_render_back_to_themselves() -> None:
    # What ``derive`` writes reads back as the same values (the literals round-trip).
    namespace: dict[str, object] = {}
    exec(derive.render(derive.derived()), namespace)
    assert {name: namespace[name] for name in derive.derived()} == derive.derived()


def test_checking_a_messages_request_does_not_import_the_sdk() -> None:
    # A fresh interpreter: the checks and the route load, and a body is checked, with the
    # SDK (a second and some 60 MB) still unloaded.
    code = (
        "import sys\n"
        "import gateway.app\n"
        "from gateway.codecs.messages import checked_body\n"
        'checked_body(b\'{"model": "m", "max_tokens": 5,'
        ' "messages": [{"role": "user", "content": "hi"}]}\')\n'
        "print(sorted(m for m in ('anthropic', 'pydantic', 'redis') if m in sys.modules))\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert shown.strip() == "[]"
