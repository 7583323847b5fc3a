"""The admin console in a real browser (Debian's Chromium, headless, driven by Playwright)
against the real stack: uvicorn, Celery beat and control worker, a node agent and the demo
replica. Screenshots of every page go to test-artifacts/console/."""

from __future__ import annotations

import itertools
import json
import os
import re
import time
import uuid
from pathlib import Path

import pytest
from django.db import connections
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from playwright.sync_api import expect, sync_playwright

from tests.support.stack import ROOT, committed, demo_model, processes, stack_env, wait_online, wait_ready
from workers.bench.processes import free_port

pytestmark = [pytest.mark.timeout(300), pytest.mark.django_db]
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts" / "console"
TIER_BYTES = 64 << 20
PAGES = ["Overview", "Deployments", "Models", "Inventory", "Cache policies", "API keys", "Batches", "Usage",
         "Events", "Playground"]  # fmt: skip


@pytest.fixture(scope="module")
def site(django_db_setup, django_db_blocker, tmp_path_factory):
    from django.contrib.auth import get_user_model

    from controlplane.deployments.models import CachePolicy
    from controlplane.deployments.services import create_deployment

    assert (ROOT / "frontend" / "dist" / "index.html").is_file(), "build the console first: make setup"
    assert Path(CHROMIUM).is_file(), "install Debian's chromium: make setup"
    state = tmp_path_factory.mktemp("console")
    node, port = f"ui-{uuid.uuid4().hex[:6]}", free_port()
    env = stack_env(state, REPLICA_CPU_THREADS="1", TELEMETRY_INTERVAL="1", USAGE_FLUSH_INTERVAL="1")
    with committed(django_db_blocker):
        get_user_model().objects.create_user("operator", password="pw-operator-1", is_staff=True)
        model = demo_model()
        with processes(state, node, env, web_port=port, beat=True):
            wait_online(node)
            # Speculating as make run's demo does without a draft head.
            create_deployment(
                {"slug": "demo", "model": model, "replicas": 1, "speculative_method": "ngram", "speculative_k": 3}
            )
            # A deployment whose cache policy keeps evicted KV blocks in host memory.
            tiered = CachePolicy.objects.create(name="tiered", dram_tier_bytes=TIER_BYTES)
            create_deployment({"slug": "tiered", "model": model, "replicas": 1, "cache_policy": tiered})
            wait_ready("demo", 1, 90)
            wait_ready("tiered", 1, 90)
            yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def browser(site):
    """After `site`. Playwright's sync API keeps an event loop running in this thread, and
    Django then refuses ORM calls from it (pytest-django's per-test transaction is one): the
    ORM work here is plain synchronous code, so the check is lifted while the browser runs."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as p:
        args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        yield b
        b.close()
        # Connections opened while Playwright's loop ran belong to that context: close them here.
        connections.close_all()
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


@pytest.fixture
def answers() -> list[str]:
    """What the page's next prompt dialogs are answered, in order (then: accepted as they are)."""
    return []


@pytest.fixture
def page(browser, site, answers):
    context = browser.new_context(base_url=site, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    # The confirmations of actions, and the prompts' answers
    page.on("dialog", lambda dialog: dialog.accept(answers.pop(0)) if answers else dialog.accept())
    page.goto("/")
    page.get_by_label("Username").fill("operator")
    page.get_by_label("Password").fill("pw-operator-1")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("navigation")).to_be_visible()
    yield page
    context.close()


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_sign_in_is_refused_with_a_wrong_password(browser, site):
    context = browser.new_context(base_url=site)
    page = context.new_page()
    page.goto("/")
    page.get_by_label("Username").fill("operator")
    page.get_by_label("Password").fill("nope")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("Wrong username or password.")
    shot(page, "login")
    context.close()


def test_every_page_renders_from_the_navigation(page):
    nav = page.get_by_role("navigation")
    for name in PAGES:
        nav.get_by_role("link", name=name, exact=True).click()
        expect(page.get_by_role("heading", level=1, name=name)).to_be_visible()
        page.wait_for_load_state("networkidle")
        shot(page, name.lower().replace(" ", "-"))


def test_deployments_create_validate_and_stop(page):
    page.get_by_role("link", name="Deployments", exact=True).click()
    expect(page.locator('tr[data-deployment="demo"] .states')).to_contain_text("1 ready")
    form = page.get_by_role("form", name="Create a deployment")
    form.get_by_label("Name").fill("demo")  # taken: the API's message shows under the field
    form.get_by_label("Model").select_option("demo-model")
    # The capacity plan of the chosen model, live: 4 layers x 2 KV heads of 32, float32 (a CPU node:
    # no device memory in the inventory, so no fit verdict).
    plan = page.get_by_role("region", name="Capacity plan")
    expect(plan.locator('tr[data-plan="KV cache per token"] td')).to_have_text(
        "2,048 B (2.0 KiB) whole model, 2,048 B (2.0 KiB) per device"
    )
    expect(plan.get_by_test_id("plan-fits")).to_have_text("fit unknown")
    shot(page, "deployment-plan")
    form.get_by_role("button", name="Create").click()
    expect(form.get_by_text("already exists")).to_be_visible()
    form.get_by_label("Name").fill("second")
    form.get_by_role("button", name="Create").click()
    row = page.locator('tr[data-deployment="second"]')
    expect(row).to_be_visible()
    expect(row.locator(".states")).to_contain_text("ready", timeout=60_000)
    row.get_by_role("link", name="second").click()
    expect(page.get_by_role("heading", level=1, name="second")).to_be_visible()
    page.get_by_role("button", name="Stop").click()
    expect(page.get_by_test_id("desired")).to_have_text("stopped")
    expect(page.locator("tr[data-replica]")).to_have_count(0, timeout=30_000)
    shot(page, "deployment-detail")


def test_playground_streams_the_answer_token_by_token(page):
    frames: list[dict] = []  # what the playground's socket receives (it opens when the page does)

    def watch(ws) -> None:
        if "/ws/generate/" in ws.url:
            ws.on("framereceived", lambda payload: frames.append(json.loads(payload)))

    page.on("websocket", watch)
    page.get_by_role("link", name="Playground", exact=True).click()
    page.get_by_label("Deployment").select_option("demo")
    # Record every change of the answer's text as it happens.
    page.evaluate(
        """() => { window.__texts = [];
        new MutationObserver(() => { const a = document.querySelector('[role=log] .answer');
          if (a) window.__texts.push(a.textContent); })
        .observe(document.querySelector('[role=log]'), {subtree: true, childList: true, characterData: true}); }"""
    )
    page.get_by_label("Message").fill("What is the capital of Japan?")
    page.get_by_role("button", name="Send").click()
    log = page.get_by_role("log")
    expect(log).to_contain_text("The capital of Japan is Tokyo.", timeout=30_000)
    expect(log.locator(".stats")).to_contain_text("done (stop)")
    expect(log.locator(".stats")).to_contain_text("TTFT")
    # The demo speculates (n-gram): what its replicas measured shows beside the answers.
    expect(page.get_by_test_id("playground-speculation")).to_contain_text(
        re.compile(r"Speculative decoding \(ngram, k 3\): mean acceptance length \d+\.\d\d over [1-9]\d* draft runs"),
        timeout=15_000,
    )
    # The gateway's prediction (– when it had no token ids) beside what the replica reported.
    expect(log.locator(".stats .cached")).to_have_text(re.compile(r"^cached tokens predicted (\d+|–) / actual \d+$"))
    tokens = [f["text"] for f in frames if f.get("type") == "token"]
    assert len(tokens) >= 3, frames  # streamed in several events, not all at once
    assert "".join(tokens).strip() == "The capital of Japan is Tokyo."
    # The page showed it growing (React may render several events at once when starved of CPU,
    # so how many steps it showed is not asserted).
    distinct = list(dict.fromkeys(page.evaluate("window.__texts")))
    assert distinct and distinct[-1].endswith("The capital of Japan is Tokyo."), distinct
    assert all(b.startswith(a) for a, b in itertools.pairwise(distinct)), distinct
    shot(page, "playground-answer")

    # With its tools offered, the demo model answers with a call, shown as such.
    from workers.demo.corpus import tool_schemas

    page.get_by_role("button", name="Clear").click()
    page.get_by_text('Tools (OpenAI "tools" JSON, optional)').click()
    page.get_by_label("Tools", exact=True).fill(json.dumps(tool_schemas()))
    page.get_by_label("Message").fill("What is the weather in Paris?")
    page.get_by_role("button", name="Send").click()
    expect(log).to_contain_text('→ get_weather({"city": "Paris"})', timeout=30_000)
    expect(log.locator(".stats")).to_contain_text("done (tool_calls)")
    shot(page, "playground-tool-call")


def test_overview_charts_move_live(page):
    page.get_by_role("link", name="Overview", exact=True).click()
    chart = page.locator('[data-deployment="demo"] [aria-label="Output tokens/s"]')
    expect(chart).to_be_visible()
    first = int(chart.get_attribute("data-points"))
    page.wait_for_function(
        """([sel, n]) => Number(document.querySelector(sel).dataset.points) >= n + 2""",
        arg=['[data-deployment="demo"] [aria-label="Output tokens/s"]', first],
        timeout=15_000,
    )
    # Achieved against reachable prompt-cache hit rate (– until the gateway has counted any).
    rates = page.locator('[data-deployment="demo"] [data-testid="hit-rates"]')
    expect(rates).to_have_text(re.compile(r"served from cache, since start: (\d+%|–) achieved / (\d+%|–) reachable"))
    shot(page, "overview-live")
    meta = json.dumps({"points_when_opened": first})
    (ARTIFACTS / "overview.json").write_text(meta)


def test_overview_shows_the_speculation_of_the_demo(page):
    # The answer repeats words of the question: the n-gram drafter guesses from them.
    page.get_by_role("link", name="Playground", exact=True).click()
    page.get_by_label("Deployment").select_option("demo")
    page.get_by_label("Message").fill("What is the capital of Japan?")
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_role("log").locator(".stats")).to_contain_text("done", timeout=30_000)
    page.get_by_role("link", name="Overview", exact=True).click()
    panel = page.locator('[data-deployment="demo"] [data-testid="speculation"]')
    expect(panel.get_by_test_id("speculation-method")).to_have_text("ngram, k 3")
    expect(panel.get_by_test_id("acceptance-length")).to_have_text(re.compile(r"^\d+\.\d\d$"), timeout=15_000)
    rows = panel.get_by_role("table", name="Acceptance by position").locator("tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.first.locator(".rate")).to_have_text(re.compile(r"^\d+%$"))
    shot(page, "overview-speculation")


def test_the_console_shows_a_deployments_kv_tiers_and_their_use(page):
    page.get_by_role("link", name="Deployments", exact=True).click()
    page.locator('tr[data-deployment="tiered"]').get_by_role("link", name="tiered").click()
    expect(page.get_by_test_id("policy-tiers")).to_have_text("DRAM 64 MiB per replica")
    # What the replica reports of its tier, through its agent into the replica's row.
    row = page.get_by_role("table", name="KV tier use").locator('tr[data-tier="dram"]')
    expect(row.locator(".used")).to_have_text(re.compile(r"\d+(\.\d)? [KMG]?i?B / 64 MiB$"), timeout=15_000)
    expect(row.locator("td").last).to_have_text("available")
    shot(page, "deployment-tiers")
    page.get_by_role("link", name="Cache policies", exact=True).click()
    expect(page.locator('tr[data-policy="tiered"] .tiers')).to_have_text("DRAM 64 MiB per replica")
    page.get_by_role("link", name="Overview", exact=True).click()
    rates = page.locator('[data-deployment="tiered"] [data-testid="tier-hit-rates"]')
    expect(rates).to_have_text(re.compile(r"^Hit rate by cache: device (\d+%|–) · DRAM (\d+%|–)$"), timeout=15_000)
    demo = page.locator('[data-deployment="demo"] [data-testid="tier-hit-rates"]')  # no tiers: the device cache alone
    expect(demo).to_have_text(re.compile(r"^Hit rate by cache: device (\d+%|–)$"))
    shot(page, "overview-tiers")


def test_a_keys_fair_share_weight_is_set_at_creation_and_edited(page, answers):
    page.get_by_role("link", name="API keys", exact=True).click()
    form = page.get_by_role("form", name="Create a key")
    form.get_by_label("Name").fill("batch-tenant")
    form.get_by_label("Weight").fill("0")  # refused by the API: its message shows under the field
    form.get_by_role("button", name="Create key").click()
    expect(form.get_by_text("greater than or equal to 0.01")).to_be_visible()
    form.get_by_label("Weight").fill("3")
    form.get_by_role("button", name="Create key").click()
    expect(page.get_by_test_id("secret")).to_be_visible()
    row = page.get_by_role("row").filter(has_text="batch-tenant")
    expect(row).to_contain_text("weight 3")
    answers += ["", "", "0.5"]  # rpm, tpm (no limits), then the weight
    row.get_by_role("button", name="Edit limits").click()
    expect(row).to_contain_text("weight 0.5")
    shot(page, "api-keys-weight")


def _batch(site: str, secret: str, n: int, max_tokens: int):
    """A batch of `n` chat requests to the demo, created with the official client."""
    import io

    import openai

    client = openai.OpenAI(base_url=f"{site}/v1", api_key=secret, max_retries=0, timeout=30)
    lines = [{"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "demo", "messages": [{"role": "user", "content": f"Summarise document {i}."}],
                       "max_tokens": max_tokens}} for i in range(n)]  # fmt: skip
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    f = client.files.create(file=("docs.jsonl", io.BytesIO(data)), purpose="batch")
    return client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")


def test_the_batches_page_shows_progress_and_cancels(page, site):
    page.get_by_role("link", name="API keys", exact=True).click()  # a key to send batches with
    form = page.get_by_role("form", name="Create a key")
    form.get_by_label("Name").fill("batch-console")
    form.get_by_role("button", name="Create key").click()
    secret = page.get_by_test_id("secret").inner_text()
    small = _batch(site, secret, 3, 4)
    large = _batch(site, secret, 400, 32)  # long enough to be running when it is cancelled
    page.get_by_role("link", name="Batches", exact=True).click()
    row = page.locator(f'tr[data-batch="{small.id}"]')
    expect(row.locator(".status")).to_have_text("completed", timeout=60_000)
    expect(row.locator(".counts")).to_have_text("3 completed · 0 failed · 3 total")
    with page.expect_download() as download:
        row.get_by_role("link", name="output").click()
    lines = Path(download.value.path()).read_text().splitlines()
    assert sorted(json.loads(line)["custom_id"] for line in lines) == ["doc-0", "doc-1", "doc-2"]
    big = page.locator(f'tr[data-batch="{large.id}"]')
    expect(big.locator(".status")).to_have_text("in progress")
    big.get_by_role("button", name="Cancel").click()
    expect(big.locator(".status")).to_have_text("cancelled", timeout=15_000)
    expect(big.get_by_role("link", name="errors")).to_be_visible()
    shot(page, "batches")


def test_the_usage_page_counts_the_playgrounds_requests_and_exports_csv(page):
    page.get_by_role("link", name="Playground", exact=True).click()
    page.get_by_label("Deployment").select_option("demo")
    page.get_by_label("Message").fill("What is the capital of Japan?")
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_role("log").locator(".stats")).to_contain_text("done", timeout=30_000)
    page.get_by_role("link", name="Usage", exact=True).click()
    row = page.locator('tr[data-usage="operator"]')
    # The beat flushes the gateway's counts every second here: look again until they are in. The
    # row is waited for, not counted at once: right after a reload the page has not fetched yet
    # (counting there missed every time, and the loop ran its 30 s out).
    for _ in range(30):
        try:
            row.wait_for(state="attached", timeout=1000)
            break
        except PlaywrightTimeoutError:
            page.reload()
    expect(row.locator(".requests")).to_have_text(re.compile(r"^[1-9]\d*$"))
    expect(page.get_by_role("img", name="Tokens per hour").locator(".hour")).not_to_have_count(0)
    with page.expect_download() as download:
        page.get_by_role("link", name="Download CSV").click()
    lines = Path(download.value.path()).read_text().splitlines()
    assert lines[0] == "owner,requests,input_tokens,cached_tokens,output_tokens"
    assert any(line.startswith("operator,") for line in lines[1:])
    page.get_by_label("Group by").select_option("deployment")
    expect(page.locator('tr[data-usage="demo"]')).to_be_visible()
    shot(page, "usage")


def test_events_show_their_date_and_filter_by_kind_and_keys_their_owner(page):
    page.get_by_role("link", name="Events", exact=True).click()
    table = page.get_by_role("table", name="Events")
    expect(table.locator("tbody tr").first.locator(".when")).to_contain_text(str(time.gmtime().tm_year))
    page.get_by_label("Kind").select_option("deployment.created")
    rows = table.locator("tbody tr")
    expect(rows.first).to_have_attribute("data-verb", "deployment.created")
    verbs = {row.get_attribute("data-verb") for row in rows.all()}
    assert verbs == {"deployment.created"}, verbs
    shot(page, "events-filtered")
    page.get_by_role("link", name="API keys", exact=True).click()
    form = page.get_by_role("form", name="Create a key")
    form.get_by_label("Name").fill("owned")
    form.get_by_role("button", name="Create key").click()
    expect(page.locator('tr[data-key="owned"] .owner')).to_have_text("operator (you)")
    shot(page, "api-keys-owner")


def test_the_playground_sends_tool_choice_and_response_format(page):
    page.get_by_role("link", name="Playground", exact=True).click()
    page.get_by_label("Deployment").select_option("demo")
    page.get_by_label("Output").select_option("json_object")
    page.get_by_label("Message").fill("Describe Tokyo.")
    page.get_by_role("button", name="Send").click()
    answer = page.get_by_role("log").locator(".turn").last
    expect(answer.locator(".stats")).to_contain_text("done", timeout=120_000)  # up to 128 tokens
    assert answer.locator(".answer").inner_text().split(":", 1)[1].strip().startswith("{")  # constrained to JSON
    page.get_by_role("button", name="Clear").click()
    page.get_by_label("Output").select_option("text")
    page.get_by_text('Tools (OpenAI "tools" JSON, optional)').click()
    tool = {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
    page.get_by_label("Tools", exact=True).fill(json.dumps([tool]))
    page.get_by_label("Tool choice").select_option("required")
    page.get_by_label("Message").fill("What time is it in Tokyo?")
    page.get_by_role("button", name="Send").click()
    answer = page.get_by_role("log").locator(".turn").last
    expect(answer.locator(".stats")).to_contain_text("done", timeout=120_000)  # up to 128 tokens
    expect(answer.locator(".answer code")).to_contain_text("→ get_time(")  # a call, as required
    shot(page, "playground-controls")


def test_every_page_fits_a_phones_width(browser, site):
    """At 390 px nothing makes the page scroll sideways: tables scroll within themselves."""
    context = browser.new_context(base_url=site, viewport={"width": 390, "height": 800})
    page = context.new_page()
    page.goto("/")
    page.get_by_label("Username").fill("operator")
    page.get_by_label("Password").fill("pw-operator-1")
    page.get_by_role("button", name="Sign in").click()
    nav = page.get_by_role("navigation")
    wide = {}
    for name in PAGES:
        nav.get_by_role("link", name=name, exact=True).click()
        expect(page.get_by_role("heading", level=1, name=name)).to_be_visible()
        page.wait_for_load_state("networkidle")
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > 390:
            wide[name] = width
        shot(page, f"phone-{name.lower().replace(' ', '-')}")
    context.close()
    assert wide == {}, f"pages wider than the screen: {wide}"


def test_the_request_inspector_shows_a_requests_timeline(page):
    page.get_by_role("link", name="Playground", exact=True).click()
    page.get_by_label("Deployment").select_option("demo")
    page.get_by_label("Message").fill("What is the capital of Peru?")
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_role("log").locator(".stats")).to_contain_text("done", timeout=30_000)
    page.get_by_role("link", name="Deployments", exact=True).click()
    page.locator('tr[data-deployment="demo"]').get_by_role("link", name="demo").click()
    inspector = page.get_by_role("table", name="Recent requests")
    row = inspector.locator("tbody tr").first
    expect(row).to_contain_text("user:operator")
    timeline = re.compile(r"^queue \d+ ms, prefill \d+ ms, decode \d+ ms$")
    expect(row.get_by_role("img")).to_have_attribute("aria-label", timeline)
    request_id = row.get_attribute("data-request")
    page.goto(f"/deployments/demo#req-{request_id}")  # where an event's link leads
    expect(page.locator(f'tr[data-request="{request_id}"]')).to_have_class(re.compile("highlight"))
    shot(page, "request-inspector")
