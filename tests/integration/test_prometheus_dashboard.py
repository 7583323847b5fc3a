"""A real Prometheus (Debian's `prometheus`) scrapes a stack serving the demo model, and answers
every query of the shipped Grafana dashboard (docker/grafana/dashboards/switchyard-vllm.json,
written against vLLM's metric names) with data: the names, types and labels the ecosystem's tools
expect are the ones /metrics serves."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid

import httpx
import openai
import pytest

from tests.support.stack import ROOT, demo_model, processes, stack_env, wait_for, wait_online, wait_ready
from workers.bench.processes import free_port, stop

pytestmark = [pytest.mark.timeout(240), pytest.mark.django_db(transaction=True)]
DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "switchyard-vllm.json"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def queries() -> dict[str, str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {panel["title"]: target["expr"] for panel in panels for target in panel["targets"]}


def test_prometheus_answers_every_dashboard_query_from_a_running_stack(tmp_path):
    from django.contrib.auth import get_user_model

    from controlplane.deployments.services import create_deployment
    from controlplane.gateway.services import create_api_key

    node, port, prom_port = f"prom-{uuid.uuid4().hex[:4]}", free_port(), free_port()
    env = stack_env(tmp_path, REPLICA_CPU_THREADS="1")
    _, key = create_api_key(name="k", owner=get_user_model().objects.create_user("prom"))
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs: [{{job_name: switchyard, static_configs: [{{targets: ['127.0.0.1:{port}']}}]}}]\n"
    )
    with processes(tmp_path, node, env, web_port=port):
        wait_online(node)
        create_deployment(
            {"slug": "chat", "model": demo_model(), "replicas": 1, "speculative_method": "ngram", "speculative_k": 3}
        )
        wait_ready("chat", 1, 120)
        log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed by stop()
        args = [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ]
        prom = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        api = f"http://127.0.0.1:{prom_port}/api/v1/query"
        try:

            def value(expr: str) -> list:
                try:
                    body = httpx.get(api, params={"query": expr}, timeout=5).json()
                except (httpx.HTTPError, ValueError):
                    return []
                assert body.get("status") == "success", (expr, body)
                return body["data"]["result"]

            wait_for(lambda: value('up{job="switchyard"} == 1'), 30, "Prometheus to scrape /metrics")
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=60)
            context = "Switchyard routes requests to replicas; replicas keep the cache of each prompt. " * 3
            for i in range(6):  # the same long prefix: prefix-cache hits; repeats: the n-gram drafts accept
                messages = [{"role": "user", "content": f"{context} {i % 2}"}]
                client.chat.completions.create(model="chat", max_tokens=16, temperature=0, messages=messages)
            for title, expr in queries().items():
                result = wait_for(lambda expr=expr: value(expr), 30, f"data for the panel {title!r}: {expr}")
                assert all(series["metric"].get("model_name") == "chat" for series in result), (title, result)
        finally:
            stop([prom], [log], timeout=10)
