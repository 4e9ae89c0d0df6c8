"""Who may call the server: web pages, DNS rebinding, content types, API keys (in-process, fake engine)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from engine.api import QUANTIZATION_LEVELS
from engine.serving.cli import _parser, _settings, resolve_api_key
from engine.serving.guards import GuardRules
from tests.reliability.conftest import Serve

CHAT = "/v1/chat/completions"
BODY = b'{"messages": [{"role": "user", "content": "Say hello."}]}'
EVIL = "http://evil.example"


def error_code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


def test_post_bodies_must_be_json(serve_fake: Serve) -> None:
    with serve_fake() as base, httpx.Client(base_url=base, timeout=10.0) as client:
        refused = [client.post(CHAT, content=BODY, headers={"Content-Type": kind} if kind else {})
                   for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None)]
        accepted = client.post(CHAT, content=BODY, headers={"Content-Type": "application/json; charset=utf-8"})
    assert [r.status_code for r in refused] == [415] * 4
    assert {error_code(r) for r in refused} == {"unsupported_media_type"}
    assert accepted.status_code == 200, accepted.text


@pytest.mark.parametrize(("host", "status"), [
    ("127.0.0.1:{port}", 200), ("localhost:{port}", 200), ("[::1]:{port}", 200), ("localhost", 200),
    ("hearth.localhost:{port}", 200), ("127.1.2.3", 200),
    ("evil.example:{port}", 403), ("evil.example", 403), ("192.168.1.20:{port}", 403), ("127.0.0.1.evil.example", 403),
])
def test_only_loopback_host_values_on_a_loopback_bind(serve_fake: Serve, host: str, status: int) -> None:
    with serve_fake() as base, httpx.Client(base_url=base, timeout=10.0) as client:
        response = client.get("/v1/models", headers={"Host": host.format(port=base.rsplit(":", 1)[1])})
    assert response.status_code == status, response.text
    if status == 403:
        assert error_code(response) == "host_not_allowed"


def test_any_host_when_bound_elsewhere_on_purpose(serve_fake: Serve) -> None:
    with serve_fake(GuardRules(check_host=False)) as base, httpx.Client(base_url=base, timeout=10.0) as client:
        assert client.get("/v1/models", headers={"Host": "gpu-box.lan:8000"}).status_code == 200


def test_a_web_page_cannot_call_the_server(serve_fake: Serve) -> None:
    with serve_fake() as base, httpx.Client(base_url=base, timeout=10.0) as client:
        # what a browser's fetch(..., {mode: "no-cors", body}) sends: a "simple" request with a text body
        simple = client.post(CHAT, content=BODY, headers={"Origin": EVIL, "Content-Type": "text/plain"})
        json_post = client.post(CHAT, content=BODY, headers={"Origin": EVIL, "Content-Type": "application/json"})
        models = client.get("/v1/models", headers={"Origin": EVIL})
        null_origin = client.get("/v1/models", headers={"Origin": "null"})
        preflight = client.options(CHAT, headers={"Origin": EVIL, "Access-Control-Request-Method": "POST"})
    for response in (simple, json_post, models, null_origin, preflight):
        assert response.status_code == 403, response.text
        assert error_code(response) == "origin_not_allowed"
        assert "access-control-allow-origin" not in response.headers


def test_allowed_origins_get_cors(serve_fake: Serve) -> None:
    app = "https://app.example"
    rules = GuardRules(api_key="k", allowed_origins=(app,))
    with serve_fake(rules) as base, httpx.Client(base_url=base, timeout=10.0) as client:
        preflight = client.options(CHAT, headers={"Origin": app, "Access-Control-Request-Method": "POST",
                                                  "Access-Control-Request-Headers": "authorization,content-type"})
        reply = client.post(CHAT, content=BODY, headers={"Origin": app, "Content-Type": "application/json",
                                                         "Authorization": "Bearer k"})
        no_key = client.post(CHAT, content=BODY, headers={"Origin": app, "Content-Type": "application/json"})
        other = client.get("/v1/models", headers={"Origin": EVIL, "Authorization": "Bearer k"})
    assert preflight.status_code == 204
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    for response in (preflight, reply, no_key):
        assert response.headers["access-control-allow-origin"] == app
        assert "origin" in response.headers["vary"].lower()
    assert (reply.status_code, no_key.status_code, other.status_code) == (200, 401, 403)


@pytest.mark.parametrize("metrics_auth", [False, True])
def test_metrics_auth_puts_metrics_behind_the_key(serve_fake: Serve, metrics_auth: bool) -> None:
    rules = GuardRules(api_key="k", metrics_auth=metrics_auth)
    with serve_fake(rules) as base, httpx.Client(base_url=base, timeout=10.0) as client:
        anonymous = client.get("/metrics")
        keyed = client.get("/metrics", headers={"Authorization": "Bearer k"})
        health = client.get("/health")
        models = client.get("/v1/models")
    assert (anonymous.status_code, keyed.status_code) == ((401 if metrics_auth else 200), 200)
    assert (health.status_code, models.status_code) == (200, 401)


# --- the command line -------------------------------------------------------------------------------------------

def test_api_key_from_the_environment_or_a_file(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n")
    key_file.chmod(0o600)
    parse = _parser().parse_args
    assert resolve_api_key(parse([]), {}) is None
    assert resolve_api_key(parse([]), {"HEARTH_API_KEY": "sk-from-env"}) == "sk-from-env"
    assert resolve_api_key(parse(["--api-key-file", str(key_file)]), {"HEARTH_API_KEY": "x"}) == "sk-from-file"
    assert resolve_api_key(parse(["--api-key", "sk-argv"]), {"HEARTH_API_KEY": "x"}) == "sk-argv"
    with pytest.raises(ValueError, match="not both"):
        resolve_api_key(parse(["--api-key", "a", "--api-key-file", str(key_file)]), {})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        resolve_api_key(parse(["--api-key-file", str(tmp_path / "empty")]), {})
    with pytest.raises(ValueError, match="cannot read"):
        resolve_api_key(parse(["--api-key-file", str(tmp_path / "missing")]), {})


def test_settings_from_the_command_line() -> None:
    parse = _parser().parse_args
    with pytest.raises(ValueError, match="metrics-auth needs an API key"):
        _settings(parse(["--metrics-auth"]), {})
    rules, limits = _settings(parse(["--metrics-auth", "--allow-origin", "https://a.example", "--allow-origin",
                                     "https://b.example", "--max-body-bytes", "1000", "--header-timeout", "3",
                                     "--max-connections", "9"]), {"HEARTH_API_KEY": "k"})
    assert rules.api_key == "k" and rules.metrics_auth and rules.check_host
    assert rules.allowed_origins == ("https://a.example", "https://b.example") and rules.max_body_bytes == 1000
    assert (limits.header_timeout_s, limits.max_connections) == (3.0, 9)
    assert not _settings(parse(["--host", "0.0.0.0"]), {})[0].check_host


def test_quantization_help_names_the_levels() -> None:
    help_text = " ".join(_parser().format_help().split())
    assert all(level in help_text for level in QUANTIZATION_LEVELS)
    assert "auto or none" not in help_text


@pytest.mark.skipif(os.name != "posix", reason="file modes")
def test_a_key_file_readable_by_others_is_warned_about(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk\n")
    key_file.chmod(0o644)
    assert resolve_api_key(_parser().parse_args(["--api-key-file", str(key_file)]), {}) == "sk"
    assert "chmod 600" in capsys.readouterr().err
