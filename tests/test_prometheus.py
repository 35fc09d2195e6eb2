"""A real Prometheus server (Debian's `prometheus`, installed by scripts/setup.sh) scrapes the
coordinator on loopback, and a fleet metric is read back through Prometheus' HTTP API."""

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from tests.support.fleet import enrol, start_coordinator
from tests.support.ports import free_port
from tests.support.processes import ROOT

pytestmark = [pytest.mark.process]

SCRAPE_CONFIG = """
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: specfleet-coordinator
    static_configs:
      - targets: ["127.0.0.1:{metrics_port}"]
"""


@pytest.fixture
def prometheus_binary():
    path = shutil.which("prometheus")
    if path is None:
        pytest.fail("the prometheus binary is not installed: run scripts/setup.sh (it installs Debian's prometheus)")
    return path


def query(port: int, promql: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    body = json.loads(urllib.request.urlopen(url, timeout=5).read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_prometheus_scrapes_the_coordinator(tmp_path, prometheus_binary):
    coordinator = start_coordinator(tmp_path / "coordinator")
    prometheus = None
    try:
        enrol(coordinator, "mac-a")
        enrol(coordinator, "mac-b")
        config = tmp_path / "prometheus.yml"
        config.write_text(SCRAPE_CONFIG.format(metrics_port=coordinator.metrics_port))
        port = free_port()
        log = tmp_path / "prometheus.log"
        prometheus = subprocess.Popen(
            [
                prometheus_binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 45
        result, last_error = [], None
        while not result:
            assert prometheus.poll() is None, f"prometheus exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no scrape within 45 s ({last_error}):\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
            try:
                result = query(port, 'sum(specfleet_agents{state="enrolled"})')  # not heard from yet
            except OSError as e:  # not listening yet
                last_error = e
        assert float(result[0]["value"][1]) == 2
        (up,) = query(port, 'up{job="specfleet-coordinator"}')
        assert up["metric"]["instance"] == f"127.0.0.1:{coordinator.metrics_port}" and up["value"][1] == "1"
        by_chip = query(port, "specfleet_agents")
        assert {(r["metric"]["state"], r["metric"]["chip"]) for r in by_chip} == {("enrolled", "Test CPU")}
    finally:
        if prometheus is not None:
            prometheus.terminate()
            try:
                prometheus.wait(timeout=15)
            except subprocess.TimeoutExpired:
                prometheus.kill()
                prometheus.wait(timeout=5)
        coordinator.stop()


def test_the_shipped_prometheus_config_is_valid(prometheus_binary):
    promtool = shutil.which("promtool")
    assert promtool, "promtool (part of Debian's prometheus package) is missing: run scripts/setup.sh"
    config = ROOT / "deploy/prometheus.yml"
    result = subprocess.run([promtool, "check", "config", config], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "127.0.0.1:9464" in config.read_text()  # the coordinator's default --metrics-port
