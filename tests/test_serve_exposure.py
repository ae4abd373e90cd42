"""Who may reach `rigkit serve`: the Host rule (DNS rebinding), the Origin rule, /rpc's media type,
bearer tokens that are not ASCII. In-process (TestClient, scripted model); the same rule against a
real server process is in test_serve_server.py.
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")

from fastapi.testclient import TestClient  # noqa: E402

from rigkit.serve.app import create_app  # noqa: E402
from rigkit.serve.exposure import Exposure  # noqa: E402
from tests.test_serve_protocol import LOCAL, QUESTION, make_service  # noqa: E402

EVIL = "http://evil.example"
RPC_ASK = {"jsonrpc": "2.0", "id": 1, "method": "rig.ask", "params": {"question": QUESTION}}

# every route, with a body it would answer 200 to
ROUTES = [
    ("GET", "/health", None),
    ("GET", "/v1/models", None),
    ("GET", "/openapi.json", None),
    ("GET", "/metrics", None),
    ("POST", "/chat", {"question": QUESTION}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTION}]}),
    ("POST", "/retrieve", {"queries": ["Eiffel"], "topk": 1}),
    ("POST", "/rpc", RPC_ASK),
    ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
]
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


@pytest.fixture
def app():  # one app per test: the MCP session manager runs once per app
    return create_app(make_service())


def call(client: TestClient, method: str, path: str, body, headers=None):
    headers = {**(MCP_HEADERS if path == "/mcp" else {}), **(headers or {})}
    return client.request(method, path, json=body, headers=headers)


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_every_route_answers_a_loopback_client(app, method, path, body):
    with TestClient(app, base_url=LOCAL) as client:
        assert call(client, method, path, body).status_code == 200


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_a_rebound_name_is_refused_on_every_route(app, method, path, body):
    """DNS rebinding: the page's own name now points at 127.0.0.1; the Host header still says it."""
    with TestClient(app, base_url="http://evil.example:8100") as client:
        r = call(client, method, path, body)
    assert r.status_code == 421, r.text
    assert "evil.example" in r.json()["error"]["message"] and "--allow-host" in r.json()["error"]["message"]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_a_foreign_origin_is_refused_on_every_route(app, method, path, body):
    with TestClient(app, base_url=LOCAL) as client:
        r = call(client, method, path, body, {"Origin": EVIL})
    assert r.status_code == 403, r.text
    assert r.json()["error"]["code"] == "origin_not_allowed" and "--allow-origin" in r.json()["error"]["message"]


def test_same_origin_and_listed_origins_pass_with_cors_headers():
    exposure = Exposure(origins=("http://localhost:3000",))
    with TestClient(create_app(make_service(), exposure=exposure, mcp=False), base_url="http://localhost:8100") as c:
        assert c.get("/v1/models", headers={"Origin": "http://localhost:8100"}).status_code == 200  # its own page
        listed = c.post("/retrieve", json={"queries": ["Eiffel"]}, headers={"Origin": "http://localhost:3000"})
        assert listed.status_code == 200
        assert listed.headers["access-control-allow-origin"] == "http://localhost:3000"
        preflight = c.options("/chat", headers={"Origin": "http://localhost:3000", "Access-Control-Request-Method":
                                                "POST", "Access-Control-Request-Headers": "content-type"})
        assert preflight.status_code == 200
        assert c.get("/v1/models", headers={"Origin": "http://localhost:3001"}).status_code == 403
        assert c.get("/v1/models", headers={"Origin": "null"}).status_code == 403  # sandboxed frames, file://


@pytest.mark.parametrize(
    ("bind", "hosts", "header", "allowed"),
    [
        ("127.0.0.1", (), "127.0.0.1:8100", True),
        ("127.0.0.1", (), "localhost:8100", True),
        ("127.0.0.1", (), "[::1]:8100", True),
        ("127.0.0.1", (), "localhost.evil.example", False),
        ("127.0.0.1", (), "10.0.0.5:8100", False),
        ("127.0.0.1", ("rig.internal",), "rig.internal:8100", True),
        ("::1", (), "[::1]:8100", True),
        ("10.0.0.5", (), "10.0.0.5:8100", True),
        ("10.0.0.5", (), "10.0.0.6:8100", False),
        ("10.0.0.5", (), "evil.example", False),
        ("0.0.0.0", (), "192.168.1.9:8100", True),  # an address cannot come from a rebinding
        ("0.0.0.0", (), "evil.example:8100", False),
        ("0.0.0.0", ("rig.example.org",), "RIG.example.org", True),
        ("127.0.0.1", (), "", False),
    ],
)
def test_host_rule(bind, hosts, header, allowed):
    assert Exposure(bind=bind, hosts=hosts).host_allowed(header) is allowed


def test_an_allowed_origin_must_be_an_origin():
    with pytest.raises(ValueError, match="scheme://host"):
        Exposure(origins=("localhost:3000",))
    with pytest.raises(ValueError, match="scheme://host"):
        Exposure(origins=("http://localhost:3000/app",))


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          None])
def test_rpc_takes_only_json(app, content_type):
    """Bodies a cross-site page may POST without a preflight never reach `rig.ask`."""
    import json

    headers = {"content-type": content_type} if content_type else {}
    with TestClient(app, base_url=LOCAL) as client:
        r = client.post("/rpc", content=json.dumps(RPC_ASK).encode(), headers=headers)
        assert r.status_code == 415, r.text
        assert r.json()["error"]["param"] == "content-type"
        ok = client.post("/rpc", content=json.dumps(RPC_ASK).encode(),
                         headers={"content-type": "application/json; charset=utf-8"})
        assert ok.status_code == 200 and ok.json()["result"]["answer"]


@pytest.mark.parametrize("token", ["s3cret\u00e9", "\u5bc6\u94a5", "s3cre\u00ff"])
def test_a_non_ascii_bearer_token_is_a_401(token):
    with TestClient(create_app(make_service(), api_key="s3cret", mcp=False), base_url=LOCAL) as client:
        r = client.get("/v1/models", headers={"Authorization": f"Bearer {token}".encode()})
        assert r.status_code == 401, r.text


def test_a_non_ascii_key_matches_its_utf8_token():
    with TestClient(create_app(make_service(), api_key="cl\u00e9", mcp=False), base_url=LOCAL) as client:
        assert client.get("/v1/models", headers={"Authorization": "Bearer cl\u00e9".encode()}).status_code == 200
        assert client.get("/v1/models", headers={"Authorization": "Bearer cle"}).status_code == 401


def test_metrics_need_the_key_as_every_route_does():
    with TestClient(create_app(make_service(), api_key="s3cret", mcp=False), base_url=LOCAL) as client:
        refused = client.get("/metrics")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        ok = client.get("/metrics", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.headers["content-type"].startswith("text/plain")
        assert 'rigkit_refused_requests_total{reason="key"} 1.0' in ok.text  # and no series of its own
        assert 'status="401"' not in ok.text


def test_the_cli_warns_loudly_when_binding_beyond_loopback(capsys):
    from rigkit.cli.serve import _warn_wide_bind

    _warn_wide_bind(Exposure(bind="0.0.0.0"), authenticated=False)
    err = capsys.readouterr().err
    assert err.count("WARNING") == 2 and "--server-key-env" in err and "--allow-host" in err


def test_the_cli_refuses_an_allowed_origin_that_is_not_an_origin_before_loading(capsys):
    from rigkit.cli import main

    assert main(["serve", "--allow-origin", "localhost:3000"]) == 2
    assert "scheme://host" in capsys.readouterr().err


@pytest.mark.parametrize("path", ["/chat", "/retrieve", "/v1/chat/completions"])
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_every_json_route_names_the_media_type_it_takes(app, path, content_type):
    headers = {"content-type": content_type} if content_type else {}
    with TestClient(app, base_url=LOCAL) as client:
        r = client.post(path, content=b'{"question": "q", "queries": ["q"]}', headers=headers)
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"], r.text


def test_allowed_origins_are_compared_as_browsers_send_them():
    exposure = Exposure(origins=("http://LocalHost:3000/",))
    assert exposure.origins == ("http://localhost:3000",)
    assert exposure.origin_allowed("http://localhost:3000", "127.0.0.1:8100")
    assert not exposure.origin_allowed("http://localhost:3000.evil.example", "127.0.0.1:8100")
    assert not exposure.origin_allowed("https://localhost:3000", "127.0.0.1:8100")


def test_a_listed_origins_preflight_needs_no_token_but_its_request_does():
    exposure = Exposure(origins=("http://localhost:3000",))
    app = create_app(make_service(), api_key="s3cret", exposure=exposure, mcp=False)
    origin = {"Origin": "http://localhost:3000"}
    with TestClient(app, base_url=LOCAL) as client:
        preflight = client.options("/retrieve", headers={**origin, "Access-Control-Request-Method": "POST",
                                                         "Access-Control-Request-Headers": "authorization"})
        assert preflight.status_code == 200  # browsers send preflights without credentials
        assert client.post("/retrieve", json={"queries": ["Eiffel"]}, headers=origin).status_code == 401
        ok = client.post("/retrieve", json={"queries": ["Eiffel"]}, headers={**origin, "Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
