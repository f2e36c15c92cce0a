"""hclog JSON line format (what go-plugin's log parser accepts) and secret redaction."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from nomad_plugin.goplugin import logging as hclog

# Go layout 2006-01-02T15:04:05.000000Z07:00: exactly six fractional digits, Z or ±hh:mm.
TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$")


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = hclog.make_handler(stream)
    logger = logging.getLogger("nomad_plugin.xdm.client")
    logger.addHandler(handler)
    logger.setLevel(hclog.TRACE)
    logger.propagate = False
    try:
        yield logger, stream
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        hclog.set_secrets([])


def entries(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_levels_module_and_timestamp(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    logger.log(hclog.TRACE, "t")
    logger.debug("d")
    logger.info("i %s", "x")
    logger.warning("w")
    logger.error("e")
    logger.critical("c")
    lines = entries(stream)
    assert [e["@level"] for e in lines] == ["trace", "debug", "info", "warn", "error", "error"]
    assert lines[2]["@message"] == "i x"
    for entry in lines:
        assert entry["@module"] == "nomad-device-lingjun.xdm.client"
        assert TIMESTAMP.match(str(entry["@timestamp"])), entry["@timestamp"]


def test_fields_become_top_level_keys_and_one_line_per_record(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    logger.info("multi\nline", extra={"fields": {"card": 3, "ids": ("a", "b"), "@level": "bogus"}})
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        logger.exception("failed")
    text = stream.getvalue()
    assert text.count("\n") == 2
    first, second = entries(stream)
    assert first["card"] == 3 and first["ids"] == ["a", "b"] and first["@level"] == "info"
    # A newline in a message continues as "  | ": the agent writes messages as they are, and a line
    # starting with "[ERROR] agent:" would pass for one of its own (goplugin/logging.py).
    assert first["@message"] == "multi\n  | line"
    assert second["@level"] == "error" and "RuntimeError: boom" in str(second["error"])


def test_configured_secret_and_token_assignments_are_redacted(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    secret = "3f1e2d4c-aaaa-bbbb-cccc-0123456789ab"
    hclog.set_secrets([secret])
    logger.info("calling with %s", secret, extra={"fields": {"header": f"X-Nomad-Token: {secret}"}})
    logger.info("env NOMAD_TOKEN=unconfigured-value-9")
    try:
        raise ValueError(f"bad token {secret}")
    except ValueError:
        logger.exception("request failed")
    text = stream.getvalue()
    assert secret not in text
    assert "unconfigured-value-9" not in text
    assert text.count(hclog.REDACTED) >= 4


def test_every_spelling_of_a_token_with_a_newline_is_redacted(captured: tuple[logging.Logger, io.StringIO]) -> None:
    """The HTTP library once quoted a bad header as b'...\\n': the raw form alone was masked."""
    logger, stream = captured
    secret = "7c0ffee0-aaaa-bbbb-cccc-0123456789ab\n"
    hclog.set_secrets([secret])
    logger.error("LocalProtocolError: Illegal header value %r", secret.encode())
    logger.error("value %r, json %s", secret, json.dumps(secret))
    logger.error("url-encoded %s", "7c0ffee0-aaaa-bbbb-cccc-0123456789ab%0A")
    text = stream.getvalue()
    assert "7c0ffee0" not in text, text
    assert text.count(hclog.REDACTED) >= 4


def test_xdm_text_cannot_forge_a_line_or_rewrite_the_terminal(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    logger.error("XDM said: %s", "no\n[ERROR] agent: FORGED\x1b[31m\rhidden", extra={"fields": {"reason": "a\x1bb\nc"}})
    (entry,) = entries(stream)
    assert entry["@message"] == "XDM said: no\n  | [ERROR] agent: FORGED\\x1b[31m\\x0dhidden"
    assert entry["reason"] == "a\\x1bb\nc", "a value keeps its newline (hclog prefixes it) but no ESC"


def test_level_mapping_and_module_names() -> None:
    assert hclog.hclog_level(logging.WARNING) == "warn"
    assert hclog.hclog_level(logging.CRITICAL) == "error"
    assert hclog.hclog_level(1) == "trace"
    assert hclog.module_name("nomad_plugin") == "nomad-device-lingjun"
    assert hclog.module_name("xdm") == "nomad-device-lingjun.xdm"
    assert hclog.module_name("nomad-device-lingjun.x") == "nomad-device-lingjun.x"
    assert TIMESTAMP.match(hclog.hclog_timestamp(0.5)) and hclog.hclog_timestamp(0.5).endswith(".500000Z")


def test_set_level_follows_config_log_level() -> None:
    root = logging.getLogger("nomad_plugin")
    before = root.level
    try:
        hclog.set_level("warn")
        assert root.level == logging.WARNING
        hclog.set_level("trace")
        assert root.level == hclog.TRACE
    finally:
        root.setLevel(before)


def test_huge_messages_stay_one_parseable_line_below_go_plugins_buffer(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured
    logger.info("x" * 200_000, extra={"fields": {"blob": "y" * 100_000, "nested": [[[[["deep"]]]]]}})
    (line,) = stream.getvalue().splitlines()
    assert len(line.encode()) < 64 * 1024
    entry = json.loads(line)
    assert entry["@message"].startswith("xxx") and "more characters" in entry["@message"]


def test_every_module_logs_under_the_tree_log_level_sets() -> None:
    """log_level sets the ``nomad_plugin`` logger: a module logger outside that tree would stay at the root's WARNING."""
    import ast
    import importlib
    import pkgutil
    from pathlib import Path

    import nomad_plugin

    package_dir = Path(nomad_plugin.__file__).parent
    calls = []
    for path in package_dir.rglob("*.py"):
        if "_proto" in path.parts or path == package_dir / "goplugin" / "logging.py":  # the handler's own module
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "logging.getLogger":
                if [ast.unparse(a) for a in node.args] != ["__name__"]:
                    calls.append(f"{path.relative_to(package_dir)}:{node.lineno}: {ast.unparse(node)}")
    assert not calls, f"a module logs with logging.getLogger(__name__): {calls}"

    outside = []
    for info in pkgutil.walk_packages(nomad_plugin.__path__, "nomad_plugin."):
        if "._proto" in info.name or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, logging.Logger) and not value.name.startswith("nomad_plugin."):
                outside.append(f"{info.name}.{name} = {value.name}")
    assert not outside, outside
