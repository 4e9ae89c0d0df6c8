"""The MCP host against real servers that nobody here wrote, each started by the tests from an ``mcpServers``
entry as a user would write it: PyPI's ``mcp-server-time`` and ``mcp-server-git`` (the ``[test]`` extra), npm's
``@modelcontextprotocol/server-filesystem`` and ``server-everything`` (``make install`` puts them in the venv's
``npm`` folder when npm is on PATH; without node, npm or the packages those tests skip, saying which is missing).

Each server starts once per module; the calls go through ``engine.mcp.host`` and, where the model and the user see
the outcome, through the tool loop.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from engine.mcp.approvals import ApprovalStore, Decision
from engine.mcp.config import McpConfig, parse_config
from engine.mcp.host import MAX_RESULT_CHARS, McpHost
from engine.mcp.loop import run_tool_loop
from tests.engine.mcp.test_loop import ScriptedLLM, _call

VENV_BIN = Path(sys.executable).parent
#: where ``make install`` puts the npm servers: the venv's own ``npm`` folder
NPM_PREFIX = Path(sys.prefix) / "npm"
NPM_SERVERS = {"filesystem": "mcp-server-filesystem", "everything": "mcp-server-everything"}


def time_entry() -> dict[str, object]:
    """mcp-server-time as its README configures it, with the venv's console script as the command."""
    return {"command": str(VENV_BIN / "mcp-server-time"), "args": ["--local-timezone", "UTC"]}


def npm_server(name: str) -> Path:
    """The installed npm server ``name`` (a key of NPM_SERVERS); skips, naming what is missing, when it is not."""
    if shutil.which("node") is None:
        pytest.skip(f"@modelcontextprotocol/server-{name} needs node on PATH")
    script = NPM_PREFIX / "node_modules" / ".bin" / NPM_SERVERS[name]
    if not script.exists():
        how = "npm is not on PATH to install it" if shutil.which("npm") is None else "run make install"
        pytest.skip(f"@modelcontextprotocol/server-{name} is not installed in {NPM_PREFIX} ({how})")
    return script


def start(config: McpConfig, name: str, call_timeout_s: float = 30) -> McpHost:
    """A host over ``config`` with ``name`` started (a failed start fails the test, with the server's stderr)."""
    host = McpHost(config, call_timeout_s=call_timeout_s, start_timeout_s=60)
    status = host.start(name).result(90)
    if status.state != "ready":
        host.close()
        pytest.fail(f"{name} did not start: {status.error}\n" + "\n".join(status.stderr_tail))
    return host


# --- mcp-server-time --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def time_host() -> Iterator[McpHost]:
    with start(parse_config({"mcpServers": {"time": time_entry()}}), "time") as host:
        yield host


def test_the_time_server_lists_its_tools(time_host: McpHost) -> None:
    tools = {t.name: t for t in time_host.status("time")[0].tools}
    assert {"get_current_time", "convert_time"} <= set(tools)
    assert "timezone" in tools["get_current_time"].input_schema["properties"]


def test_the_time_in_tokyo(time_host: McpHost) -> None:
    result = time_host.call_tool("time", "get_current_time", {"timezone": "Asia/Tokyo"}).result(60)
    assert not result.is_error, result.text
    answer = json.loads(result.text)
    assert answer["timezone"] == "Asia/Tokyo"
    when = datetime.fromisoformat(answer["datetime"])
    assert when.utcoffset() == timedelta(hours=9)
    assert abs(when - datetime.now(UTC)) < timedelta(minutes=5)


def test_a_time_converted_between_zones(time_host: McpHost) -> None:
    result = time_host.call_tool("time", "convert_time", {
        "source_timezone": "Europe/Paris", "time": "09:30", "target_timezone": "Asia/Tokyo"}).result(60)
    assert not result.is_error, result.text
    answer = json.loads(result.text)
    source = datetime.fromisoformat(answer["source"]["datetime"])
    target = datetime.fromisoformat(answer["target"]["datetime"])
    assert (source.hour, source.minute) == (9, 30) and answer["target"]["timezone"] == "Asia/Tokyo"
    assert target == source and target.utcoffset() == source.astimezone(ZoneInfo("Asia/Tokyo")).utcoffset()


def test_an_unknown_zone_comes_back_as_an_error_result(time_host: McpHost) -> None:
    result = time_host.call_tool("time", "get_current_time", {"timezone": "Mars/Olympus_Mons"}).result(60)
    assert result.is_error and "Mars/Olympus_Mons" in result.text


def test_the_command_line_lists_the_time_server_ready(tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"time": time_entry()}}))
    done = subprocess.run([sys.executable, "-m", "engine.mcp", "list", "--config", str(config), "--json"],
                          check=False, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[3])
    assert done.returncode == 0, done.stderr
    (listed,) = json.loads(done.stdout)
    assert (listed["name"], listed["state"], listed["error"]) == ("time", "ready", "")
    assert {"get_current_time", "convert_time"} <= {t["name"] for t in listed["tools"]}


# --- mcp-server-git ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("git") is None:
        pytest.skip("mcp-server-git needs git on PATH")
    root = tmp_path_factory.mktemp("repo")

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, timeout=30)
    git("init", "-q", "-b", "main")
    git("config", "user.name", "Hearth Tests")
    git("config", "user.email", "tests@hearth.invalid")
    (root / "notes.txt").write_text("first line\n")
    git("add", "notes.txt")
    git("commit", "-q", "-m", "Add the notes")
    (root / "todo.txt").write_text("not yet added\n")
    return root


@pytest.fixture(scope="module")
def git_host(repo: Path) -> Iterator[McpHost]:
    entry = {"command": sys.executable, "args": ["-m", "mcp_server_git", "--repository", str(repo)]}
    with start(parse_config({"mcpServers": {"git": entry}}), "git") as host:
        yield host


def test_the_git_server_on_a_temporary_repository(git_host: McpHost, repo: Path) -> None:
    assert {"git_status", "git_log"} <= {t.name for t in git_host.status("git")[0].tools}
    status = git_host.call_tool("git", "git_status", {"repo_path": str(repo)}).result(60)
    assert not status.is_error and "main" in status.text and "todo.txt" in status.text
    log = git_host.call_tool("git", "git_log", {"repo_path": str(repo)}).result(60)
    assert not log.is_error and "Add the notes" in log.text and "Hearth Tests" in log.text


def test_the_git_server_refuses_a_repository_outside_its_own(git_host: McpHost, tmp_path: Path) -> None:
    result = git_host.call_tool("git", "git_status", {"repo_path": str(tmp_path)}).result(60)
    assert result.is_error and "outside the allowed repository" in result.text


# --- @modelcontextprotocol/server-filesystem --------------------------------------------------------------------
@pytest.fixture(scope="module")
def fs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("fs")
    root = base / "root"
    (root / "sub").mkdir(parents=True)
    (root / "hello.txt").write_text("hello from inside\n")
    (base / "secret.txt").write_text("SECRET CONTENTS\n")
    return root.resolve()


@pytest.fixture(scope="module")
def fs_host(fs_root: Path) -> Iterator[McpHost]:
    config = parse_config({"mcpServers": {"files": {"command": str(npm_server("filesystem")),
                                                    "args": [str(fs_root)]}}})
    with start(config, "files") as host:
        yield host


def test_the_filesystem_server_reads_and_lists_inside_its_root(fs_host: McpHost, fs_root: Path) -> None:
    read = fs_host.call_tool("files", "read_text_file", {"path": str(fs_root / "hello.txt")}).result(60)
    assert (read.text, read.is_error) == ("hello from inside\n", False)
    listed = fs_host.call_tool("files", "list_directory", {"path": str(fs_root)}).result(60)
    assert not listed.is_error and "[FILE] hello.txt" in listed.text and "[DIR] sub" in listed.text


def test_a_path_outside_the_root_is_refused_and_shown_as_refused(fs_host: McpHost, fs_root: Path,
                                                                  tmp_path: Path) -> None:
    outside = fs_root.parent / "secret.txt"
    for path in (str(outside), str(fs_root / ".." / "secret.txt")):
        direct = fs_host.call_tool("files", "read_text_file", {"path": path}).result(60)
        assert direct.is_error and "Access denied" in direct.text and "SECRET" not in direct.text
    # through the loop: the model reads the refusal as the call's result, and the step is marked failed
    llm = ScriptedLLM([_call("read_text_file", path=str(outside)), "I may not read that file."])
    result = run_tool_loop(llm, [{"role": "user", "content": "read the secret"}], fs_host,
                           lambda request: Decision.ALLOW_ONCE, ApprovalStore(tmp_path / "approvals.json"),
                           tools=list(fs_host.status("files")[0].tools))
    (step,) = result.steps
    assert step.decision is Decision.ALLOW_ONCE and step.result.is_error
    assert "Access denied - path outside allowed directories" in step.result.text
    (tool_message,) = [m for m in result.messages if m["role"] == "tool"]
    assert tool_message["content"] == step.result.text and "SECRET" not in tool_message["content"]
    assert result.text == "I may not read that file."


# --- @modelcontextprotocol/server-everything --------------------------------------------------------------------
@pytest.fixture(scope="module")
def everything() -> Iterator[McpHost]:
    config = parse_config({"mcpServers": {"everything": {"command": str(npm_server("everything"))}}})
    with start(config, "everything", call_timeout_s=20) as host:
        yield host


def test_a_tool_that_reports_progress(everything: McpHost) -> None:
    seen: list[tuple[float, float | None, str]] = []
    result = everything.call_tool("everything", "trigger-long-running-operation", {"duration": 0.4, "steps": 4},
                                  on_progress=lambda *p: seen.append(p)).result(30)
    assert not result.is_error and "Long running operation completed" in result.text
    assert [(done, total) for done, total, _ in seen] == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_a_long_operation_past_its_timeout_is_abandoned_and_the_server_goes_on(everything: McpHost) -> None:
    result = everything.call_tool("everything", "trigger-long-running-operation", {"duration": 30, "steps": 3},
                                  timeout_s=0.5).result(30)
    assert result.is_error and "did not answer within 0.5 s" in result.text
    assert everything.call_tool("everything", "echo", {"message": "still here"}).result(30).text == \
        "Echo: still here"


def test_a_large_result_comes_back_cut(everything: McpHost) -> None:
    result = everything.call_tool("everything", "echo", {"message": "y" * 3_000_000}).result(60)
    assert not result.is_error and result.text.startswith("Echo: yyy")
    assert len(result.text) < MAX_RESULT_CHARS + 100 and "the result had 3000006 characters" in result.text


def test_error_results_and_refused_arguments(everything: McpHost) -> None:
    thrown = everything.call_tool("everything", "get-resource-reference", {"resourceId": 0}).result(30)
    assert thrown.is_error and "Invalid resourceId: 0" in thrown.text
    invalid = everything.call_tool("everything", "get-sum", {"a": "one", "b": 2}).result(30)
    assert invalid.is_error and "Input validation error" in invalid.text
    assert everything.call_tool("everything", "get-sum", {"a": 1, "b": 2}).result(30).text == \
        "The sum of 1 and 2 is 3."


def test_images_and_structured_content_come_back_as_text(everything: McpHost) -> None:
    image = everything.call_tool("everything", "get-tiny-image", {}).result(30)
    assert not image.is_error and "[image: image/png," in image.text
    weather = everything.call_tool("everything", "get-structured-content", {"location": "Chicago"}).result(30)
    assert not weather.is_error and isinstance(weather.structured, dict) and "temperature" in weather.structured
