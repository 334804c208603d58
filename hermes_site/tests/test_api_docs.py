"""`/api/docs/` and `/api/schema/`: behind login, offline, under the site's CSP,
and describing the run, stream and WebSocket endpoints.
"""

import re
import shutil

import httpx
import pytest
from django.test import Client

from hermes_testing.harness import STRICT_CSP, csp_directives


def session_cookie(user) -> dict:
    client = Client()
    client.force_login(user)
    return {"Cookie": f"sessionid={client.cookies['sessionid'].value}"}


def test_docs_and_schema_need_login(server, transactional_db):
    docs = httpx.get(f"{server.url}/api/docs/")
    assert docs.status_code == 302
    assert docs.headers["Location"].startswith("/accounts/login/")
    assert httpx.get(f"{server.url}/api/schema/").status_code in (401, 403)


@pytest.mark.slow
def test_docs_load_everything_from_this_site_under_the_csp(server, alice):
    cookie = session_cookie(alice[0])
    page = httpx.get(f"{server.url}/api/docs/", headers=cookie)
    assert page.status_code == 200
    assert csp_directives(page.headers["Content-Security-Policy"]) == STRICT_CSP
    html = page.text
    assert "cdn" not in html.lower() and "@latest" not in html
    assert "<style" not in html  # style-src 'self'
    inline = re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html)
    assert inline == []  # script-src 'self'
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert len(assets) >= 4  # css, bundle, preset, start-up script (+ icon)
    for url in assets:
        url = url.replace("&amp;", "&")
        assert not re.match(r"^(https?:)?//", url), url
        response = httpx.get(f"{server.url}{url}", headers=cookie)
        assert response.status_code == 200, url
    script = next(u for u in assets if "script" in u).replace("&amp;", "&")
    assert "/api/schema/" in httpx.get(f"{server.url}{script}", headers=cookie).text


def test_schema_describes_runs_streams_and_the_websocket(server, alice):
    response = httpx.get(f"{server.url}/api/schema/?format=json", headers=alice[1])
    assert response.status_code == 200
    schema = response.json()
    paths = schema["paths"]
    start = paths["/api/sessions/{session_id}/runs/"]["post"]
    assert {"200", "201", "400", "409", "422"} <= set(start["responses"])
    run = paths["/api/runs/{run_id}/"]["get"]["responses"]["200"]
    assert run["content"]["application/json"]["schema"]["$ref"].endswith("/RunSummary")
    events = paths["/api/runs/{run_id}/events/"]["get"]
    assert "text/event-stream" in events["responses"]["200"]["content"]
    assert {p["name"] for p in events["parameters"]} >= {
        "after_seq",
        "after_event_id",
        "Last-Event-ID",
    }
    assert (
        "text/event-stream"
        in (paths["/api/stream/"]["get"]["responses"]["200"]["content"])
    )
    assert "/ws/runs/{run_id}/" in schema["info"]["description"]
    assert "4401" in schema["info"]["description"]


@pytest.mark.browser
@pytest.mark.skipif(not shutil.which("chromium"), reason="needs /usr/bin/chromium")
def test_swagger_ui_renders_offline_without_csp_violations(server, alice):
    from playwright.sync_api import sync_playwright

    cookie = session_cookie(alice[0])["Cookie"].split("=", 1)[1]
    problems, outside = [], []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=shutil.which("chromium"),
            args=["--headless", "--no-sandbox", "--disable-gpu"],
        )
        context = browser.new_context(base_url=server.url)
        context.add_cookies([{"name": "sessionid", "value": cookie, "url": server.url}])

        def offline(route):  # no internet: anything not this site fails
            if route.request.url.startswith(server.url):
                route.continue_()
            else:
                outside.append(route.request.url)
                route.abort()

        context.route("**/*", offline)
        page = context.new_page()
        page.on(
            "console",
            lambda m: problems.append(m.text) if m.type == "error" else None,
        )
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto("/api/docs/")
        page.wait_for_selector(".opblock-summary-path", timeout=30_000)
        paths = page.locator(".opblock-summary-path").all_inner_texts()
        browser.close()
    assert any("/api/runs/{run_id}/events/" in p for p in paths)
    assert outside == []
    assert not [p for p in problems if "Content Security Policy" in p], problems
