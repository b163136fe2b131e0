"""The container image's recipe: ``Dockerfile`` and ``.dockerignore`` at the repository root.

No image is built here (CI has no container engine); the recipe is read as the builder
reads it and held to what an operator relies on. Every check is a function that returns
the problems it sees, so the same checks run on the real files (no problem) and on broken
copies of them (the problem is named), which shows each check can fail.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text(encoding="utf-8")
DOCKERIGNORE = (ROOT / ".dockerignore").read_text(encoding="utf-8")


@dataclass(frozen=True)
class Instruction:
    """One instruction, its continuation lines joined: ``COPY --from=build /a /b``."""

    keyword: str
    arguments: str

    def exec_form(self) -> list[str] | None:
        """The arguments as a JSON array (exec form), or ``None`` for shell form."""
        if not self.arguments.startswith("["):
            return None
        try:
            value = json.loads(self.arguments)
        except ValueError:
            return None
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return value
        return None

    def flags_and_words(self) -> tuple[dict[str, str], list[str]]:
        """``--name=value`` flags, then the remaining words (exec or shell form)."""
        rest, flags = self.arguments, {}
        while flag := re.match(r"--([\w-]+)(?:=(\S*))?\s*", rest):
            flags[flag[1]] = flag[2] or ""
            rest = rest[flag.end() :]
        words = Instruction(self.keyword, rest).exec_form()
        return flags, words if words is not None else shlex.split(rest)


@dataclass
class Stage:
    """The instructions from one ``FROM`` to the next."""

    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [item for item in self.instructions if item.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for item in self.all("ENV"):
            words = shlex.split(item.arguments)
            if len(words) >= 2 and "=" not in words[0]:
                values[words[0]] = " ".join(words[1:])  # the old ``ENV NAME value`` form
                continue
            for word in words:
                name, _, value = word.partition("=")
                values[name] = value
        return values


def instructions(text: str) -> list[Instruction]:
    """The Dockerfile's instructions: comments dropped, continuation lines joined."""
    parsed: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            keyword, _, arguments = line.partition(" ")
            parsed.append(Instruction(keyword.upper(), arguments.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return parsed


def stages(text: str) -> list[Stage]:
    """The build stages, in order; instructions before the first FROM (ARG) are dropped."""
    found: list[Stage] = []
    for item in instructions(text):
        if item.keyword == "FROM":
            words = [word for word in item.arguments.split() if not word.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            found.append(Stage(base=words[0], name=name))
        elif found:
            found[-1].instructions.append(item)
    return found


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether ``.dockerignore`` keeps ``path`` out of the build context: a pattern matches
    the path or a folder above it, segment by segment (``*`` stays within a segment, ``**``
    spans any number), and the last matching pattern wins (``!`` lets a path back in)."""
    parts = path.strip("/").split("/")
    verdict = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        segments = pattern.removeprefix("!").strip("/").split("/")
        if any(_match(parts[:depth], segments) for depth in range(1, len(parts) + 1)):
            verdict = not negated
    return verdict


def _match(parts: list[str], segments: list[str]) -> bool:
    if not segments:
        return not parts
    if segments[0] == "**":
        return any(_match(parts[skip:], segments[1:]) for skip in range(len(parts) + 1))
    return (
        bool(parts)
        and fnmatch.fnmatchcase(parts[0], segments[0])
        and _match(parts[1:], segments[1:])
    )


def ignore_patterns(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


# Each check takes the Dockerfile's and .dockerignore's text and returns its problems.


def check_stages(dockerfile: str, dockerignore: str) -> list[str]:
    found = stages(dockerfile)
    problems = [] if len(found) >= 2 else [f"{len(found)} stage(s); a build and a runtime stage"]
    names = {stage.name for stage in found if stage.name}
    for stage in found:
        if stage.base not in names and not stage.base.startswith("python:3.11-slim"):
            problems.append(f"base {stage.base} is not python:3.11-slim")
    return problems


def check_locked_install(dockerfile: str, dockerignore: str) -> list[str]:
    for stage in stages(dockerfile)[:-1]:
        for run in stage.all("RUN"):
            for command in run.arguments.split("&&"):
                words = shlex.split(command)
                pairs = list(itertools.pairwise(words))
                if ("pip", "install") in pairs and ("-c", "constraints.txt") in pairs:
                    return []
    return ["no `pip install -c constraints.txt` in a build stage"]


def check_runtime_user(dockerfile: str, dockerignore: str) -> list[str]:
    user = stages(dockerfile)[-1].last("USER")
    if user is None:
        return ["the runtime stage sets no USER: it would run as root"]
    ids = user.arguments.split(":")
    if not all(part.isdigit() for part in ids) or any(int(part) == 0 for part in ids):
        return [f"USER {user.arguments} is not a numeric non-root uid[:gid]"]
    return []


def check_runtime_copies_only_the_venv(dockerfile: str, dockerignore: str) -> list[str]:
    problems = []
    for copy in stages(dockerfile)[-1].all("COPY") + stages(dockerfile)[-1].all("ADD"):
        flags, words = copy.flags_and_words()
        if "from" not in flags or words[:-1] != ["/opt/contextgate"]:
            problems.append(f"the runtime stage copies more than the venv: {copy.arguments}")
    return problems


def check_environment(dockerfile: str, dockerignore: str) -> list[str]:
    env = stages(dockerfile)[-1].env()
    return [
        f"{name} is not 1 in the runtime stage"
        for name in ("PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED")
        if env.get(name) != "1"
    ]


def check_healthcheck(dockerfile: str, dockerignore: str) -> list[str]:
    probe = stages(dockerfile)[-1].last("HEALTHCHECK")
    if probe is None or probe.arguments.upper().startswith("NONE"):
        return ["no HEALTHCHECK in the runtime stage"]
    if "http://127.0.0.1:8080/healthz" not in probe.arguments:
        return [f"the HEALTHCHECK does not probe /healthz on 8080: {probe.arguments}"]
    if "curl" in probe.arguments or "wget" in probe.arguments:
        return ["the HEALTHCHECK uses a tool the slim image does not have"]
    return []


def check_entrypoint(dockerfile: str, dockerignore: str) -> list[str]:
    runtime = stages(dockerfile)[-1]
    entrypoint, command = runtime.last("ENTRYPOINT"), runtime.last("CMD")
    problems = []
    if entrypoint is None or entrypoint.exec_form() != ["contextgate", "serve"]:
        problems.append('ENTRYPOINT is not the exec form ["contextgate", "serve"]')
    arguments = command.exec_form() if command is not None else None
    if arguments is None:
        return [*problems, "CMD is not in exec form"]
    port = arguments[arguments.index("--port") + 1] if "--port" in arguments[:-1] else None
    if port != "8080":
        problems.append("CMD does not bind port 8080")
    if "0.0.0.0" not in arguments:
        problems.append("CMD does not listen on every interface (0.0.0.0)")
    exposed = runtime.last("EXPOSE")
    if exposed is None or "8080" not in exposed.arguments.split():
        problems.append("port 8080 is not EXPOSEd")
    return problems


def check_copy_sources(dockerfile: str, dockerignore: str) -> list[str]:
    patterns = ignore_patterns(dockerignore)
    problems = []
    for stage in stages(dockerfile):
        for copy in stage.all("COPY"):
            flags, words = copy.flags_and_words()
            if "from" in flags:
                continue
            for source in words[:-1]:
                if not (ROOT / source).exists():
                    problems.append(f"COPY source {source} is not in the repository")
                elif ignored(source, patterns):
                    problems.append(f"COPY source {source} is excluded by .dockerignore")
    return problems


def check_dockerignore(dockerfile: str, dockerignore: str) -> list[str]:
    patterns = ignore_patterns(dockerignore)
    kept_out = (
        ".venv",
        ".git",
        "tests/gateway/test_app.py",
        "gateway/__pycache__",
        ".pytest_cache",
        ".mypy_cache",
        ".ruff_cache",
        ".tools/helm",
    )
    return [f".dockerignore lets {path} in" for path in kept_out if not ignored(path, patterns)]


CHECKS: list[Callable[[str, str], list[str]]] = [
    check_stages,
    check_locked_install,
    check_runtime_user,
    check_runtime_copies_only_the_venv,
    check_environment,
    check_healthcheck,
    check_entrypoint,
    check_copy_sources,
    check_dockerignore,
]


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_the_recipe_passes(check: Callable[[str, str], list[str]]) -> None:
    """The repository's Dockerfile and .dockerignore have none of the problems looked for."""
    assert check(DOCKERFILE, DOCKERIGNORE) == []


RUNTIME_FROM = "FROM python:3.11-slim-bookworm\n"


def _edit(old: str, new: str) -> str:
    assert old in DOCKERFILE, f"the Dockerfile no longer says {old!r}; update the test"
    return DOCKERFILE.replace(old, new)


def _without_healthcheck() -> str:
    return re.sub(r"\nHEALTHCHECK[^\n]*\\\n[^\n]*", "", DOCKERFILE)


# (name, what the broken Dockerfile says, the check that must object)
BROKEN: list[tuple[str, Callable[[], str], Callable[[str, str], list[str]]]] = [
    ("one stage", lambda: DOCKERFILE[DOCKERFILE.index(RUNTIME_FROM) :], check_stages),
    ("full base image", lambda: _edit(RUNTIME_FROM, "FROM python:3.11\n"), check_stages),
    ("unlocked install", lambda: _edit("-c constraints.txt", ""), check_locked_install),
    ("root user", lambda: _edit("USER 10001:10001", "USER root"), check_runtime_user),
    ("uid 0", lambda: _edit("USER 10001:10001", "USER 0:0"), check_runtime_user),
    ("no user", lambda: _edit("USER 10001:10001", ""), check_runtime_user),
    (
        "source copied",
        lambda: _edit("COPY --from=build", "COPY gateway /src/gateway\nCOPY --from=build"),
        check_runtime_copies_only_the_venv,
    ),
    (
        "bytecode written",
        lambda: _edit("PYTHONDONTWRITEBYTECODE=1", "PYTHONDONTWRITEBYTECODE=0"),
        check_environment,
    ),
    ("no probe", _without_healthcheck, check_healthcheck),
    ("probe elsewhere", lambda: _edit("8080/healthz", "8080/readyz"), check_healthcheck),
    (
        "shell entrypoint",
        lambda: _edit('ENTRYPOINT ["contextgate", "serve"]', "ENTRYPOINT contextgate serve"),
        check_entrypoint,
    ),
    ("other port", lambda: _edit('"--port", "8080"', '"--port", "9090"'), check_entrypoint),
    (
        "missing source",
        lambda: _edit("COPY pipelines ./pipelines", "COPY pipeline ./pipelines"),
        check_copy_sources,
    ),
]


@pytest.mark.parametrize(
    ("text", "check"),
    [pytest.param(make, check, id=name) for name, make, check in BROKEN],
)
def test_a_broken_recipe_is_caught(
    text: Callable[[], str], check: Callable[[str, str], list[str]]
) -> None:
    """Each check names the problem when the Dockerfile is broken the way it guards against."""
    assert check(text(), DOCKERIGNORE) != []


@pytest.mark.parametrize("kept", [".venv", ".git", "tests", "__pycache__", ".mypy_cache"])
def test_a_loose_dockerignore_is_caught(kept: str) -> None:
    """Dropping a line from .dockerignore lets that path into the build context."""
    loose = "\n".join(
        line for line in DOCKERIGNORE.splitlines() if line.strip().strip("*/") != kept
    )
    assert loose != DOCKERIGNORE, f".dockerignore has no line for {kept}"
    assert check_dockerignore(DOCKERFILE, loose) != []


def test_a_copied_file_that_dockerignore_excludes_is_caught() -> None:
    """A COPY of something the build context leaves out is named (the build would fail)."""
    assert check_copy_sources(DOCKERFILE, DOCKERIGNORE + "\nREADME.md\n") != []


def test_continued_lines_and_exec_forms_are_parsed() -> None:
    """Continuations join into one instruction; JSON arrays read as exec form."""
    parsed = instructions(
        'FROM a AS b\n# note\nRUN one \\\n    # inside\n    two\nCMD ["x", "y"]\n'
    )
    assert [item.keyword for item in parsed] == ["FROM", "RUN", "CMD"]
    assert parsed[1].arguments == "one two"
    assert parsed[2].exec_form() == ["x", "y"]
    assert Instruction("CMD", "x y").exec_form() is None
    copy = Instruction("COPY", '--from=build --chown=1:1 ["/opt/a b", "/opt/"]')
    assert copy.flags_and_words() == ({"from": "build", "chown": "1:1"}, ["/opt/a b", "/opt/"])
