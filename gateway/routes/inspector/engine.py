"""The inspector's template engine, made at the first page rendered.

Litestar makes its template engine when the application is built, and its Jinja engine
imports Jinja2 (with MarkupSafe and Litestar's plugin: some 30 modules and 2 MB) into
every process, for pages an operator may never open. ``InspectorTemplates`` is what the
application is given instead: it makes Litestar's ``JinjaTemplateEngine`` (with the
inspector's filters, ``formats.prepare_engine``) when the first page asks for a template.
That first page waits for the import, some tens of milliseconds, once per process.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.routes.inspector.formats import prepare_engine

if TYPE_CHECKING:
    from jinja2 import Template
    from litestar.plugins.jinja import JinjaTemplateEngine
    from litestar.template.base import TemplateCallableType

__all__ = ["InspectorTemplates"]


class InspectorTemplates:
    """Litestar's template engine protocol over a ``JinjaTemplateEngine`` made on first
    use from ``directory`` (autoescaping, the inspector's filters)."""

    __slots__ = ("_callables", "_directory", "_engine")

    def __init__(self, directory: Path | list[Path] | None, engine_instance: Any = None) -> None:
        """The signature Litestar calls an engine class with (``engine_instance`` unused:
        the environment is the one made from ``directory``)."""
        self._directory = directory
        self._engine: JinjaTemplateEngine | None = None
        self._callables: dict[str, Any] = {}

    @property
    def loaded(self) -> bool:
        """Whether Jinja2 has been loaded (a page was rendered)."""
        return self._engine is not None

    def _jinja(self) -> JinjaTemplateEngine:
        engine = self._engine
        if engine is None:
            from litestar.plugins.jinja import JinjaTemplateEngine

            engine = JinjaTemplateEngine(directory=self._directory)
            prepare_engine(engine)
            for key, template_callable in self._callables.items():
                engine.register_template_callable(key, template_callable)
            self._engine = engine
        return engine

    def get_template(self, template_name: str) -> Template:
        return self._jinja().get_template(template_name)

    def render_string(self, template_string: str, context: Mapping[str, Any]) -> str:
        return self._jinja().render_string(template_string, context)

    def register_template_callable(
        self, key: str, template_callable: TemplateCallableType[Mapping[str, Any], Any, Any]
    ) -> None:
        """Kept until the engine is made (Litestar's plugins register theirs at start-up)."""
        if self._engine is None:
            self._callables[key] = template_callable
        else:
            self._engine.register_template_callable(key, template_callable)
