"""The web server's top level: /health and /version, the console's pages (and only those) as the
SPA, JSON errors everywhere else (never the SPA or an HTML CSRF page), and the API docs served
from this server alone."""

import re
import socket
import tomllib
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.test import Client, override_settings

from controlplane.common import redis as redis_client

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def browser():
    """A client that checks CSRF like a browser's requests are checked."""
    return Client(enforce_csrf_checks=True)


def openai_error(response, status: int) -> dict:
    assert response.status_code == status and response["Content-Type"] == "application/json", response
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_health_is_200_json_when_the_database_and_redis_answer(browser):
    response = browser.get("/health")
    assert response.status_code == 200 and response.json() == {"status": "ok", "database": "ok", "redis": "ok"}


def test_health_is_503_json_when_redis_does_not_answer(browser):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    redis_client.client.cache_clear()
    try:
        with override_settings(REDIS_URL=f"redis://127.0.0.1:{port}/0"):
            response = browser.get("/health")
    finally:
        redis_client.client.cache_clear()
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "degraded" and body["database"] == "ok" and body["redis"].startswith("error")


def test_version_is_the_package_version(browser):
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    response = browser.get("/version")
    assert response.status_code == 200 and response.json() == {"version": version}


def console_routes() -> list[str]:
    """The paths the console's router knows (frontend/src/App.tsx), with a sample for each parameter."""
    routes = re.findall(r'<Route path="([^"]+)"', (ROOT / "frontend" / "src" / "App.tsx").read_text())
    assert "/deployments" in routes, routes
    return [re.sub(r":\w+", "demo", r) for r in routes if r != "*"]


def test_every_console_route_gets_the_console(browser):
    for path in console_routes():
        for variant in {path, path.rstrip("/") + "/"}:
            response = browser.get(variant)
            # 503 with an explanation when frontend/dist is not built; HTML either way.
            assert response.status_code in (200, 503), variant
            assert response["Content-Type"].startswith("text/html"), variant
            assert "csrftoken" in response.cookies  # the console's login form sends it back


@pytest.mark.parametrize("path", ["/healthy", "/version/x", "/tokenize/x", "/score", "/pooling", "/v2/models",
                                  "/deployments/demo/replicas", "/assets", "/v1/nope", "/ws/generate/"])  # fmt: skip
def test_unknown_top_level_paths_are_openai_shaped_json_404(browser, path):
    assert openai_error(browser.get(path), 404)["code"] == "unknown_url"


@pytest.mark.parametrize("path", ["/api/", "/api/v1/nope/", "/api/v2/models/", "/api/schema/x"])
def test_unknown_api_paths_are_drf_shaped_json_404(browser, path):
    response = browser.get(path)
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert set(response.json()) == {"detail"}


def test_a_missing_slash_on_the_management_api_still_redirects(browser):
    response = browser.get("/api/v1/models")
    assert response.status_code == 301 and response["Location"] == "/api/v1/models/"


@pytest.mark.parametrize("path", ["/score", "/rerank", "/nope"])  # vLLM's /tokenize is served: test_tokenize_api
def test_a_post_to_an_unknown_path_is_json_404_not_a_csrf_page(browser, path):
    response = browser.post(path, '{"prompt": "hi"}', content_type="application/json")
    assert openai_error(response, 404)["code"] == "unknown_url"


@pytest.mark.parametrize("path", ["/health", "/version", "/", "/playground"])
def test_a_post_to_a_read_only_page_is_json_405(browser, path):
    response = browser.post(path, "{}", content_type="application/json")
    assert openai_error(response, 405)["code"] == "method_not_allowed"
    assert response["Allow"] == "GET, HEAD"


def test_a_csrf_failure_outside_the_admin_is_json(browser, staff):
    browser.force_login(staff)
    response = browser.post("/api-auth/logout/")
    assert response.status_code == 403 and response["Content-Type"] == "application/json"
    assert response.json()["error"]["message"].startswith("CSRF")
    assert browser.post("/admin/logout/")["Content-Type"].startswith("text/html")  # the admin is an HTML app


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls = []

    def handle_starttag(self, tag, attrs):
        self.urls += [value for name, value in attrs if name in ("src", "href") and value]


def test_api_docs_load_only_from_this_server(browser, staff):
    browser.force_login(staff)
    page = browser.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    parser = Links()
    parser.feed(html)
    assert parser.urls and all(url.startswith("/static/") for url in parser.urls), parser.urls
    assert "https://" not in html and "http://" not in html  # no CDN, and no online spec validator
    for url in parser.urls:
        asset = Client().get(url)  # static files need no sign-in
        assert asset.status_code == 200, url
        assert b"".join(asset.streaming_content), url


def test_static_files_refuse_paths_outside_the_static_dirs(browser):
    for path in ("/static/../../pyproject.toml", "/static/%2e%2e/%2e%2e/pyproject.toml", "/static/nope.css"):
        assert browser.get(path).status_code == 404, path
