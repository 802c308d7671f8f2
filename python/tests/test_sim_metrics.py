"""`radixtier sim --metrics-port`: the endpoint, scraped while the run's output is out,
reports what the run's JSON says (summed over instances)."""

import json
import pathlib
import re
import subprocess
import time
import urllib.request

import pytest

import radixtier as rt

CLI = pathlib.Path(rt.__file__).resolve().parents[2] / "bin" / "radixtier"


@pytest.mark.skipif(not (rt.HAVE_METRICS and CLI.exists()), reason="no radixtier CLI / metrics")
def test_sim_metrics_endpoint_matches_the_run():
    p = subprocess.Popen([str(CLI), "sim", "--scenario", "churn", "--json", "--metrics-port", "0",
                          "--metrics-hold", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        port = None
        while port is None:
            line = p.stderr.readline()
            assert line, "sim ended without printing its metrics port"
            m = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", line)
            if m:
                port = int(m.group(1))
        result = json.loads(p.stdout.readline())  # the run is over, the endpoint still up
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        values = {}
        for line in text.decode().splitlines():
            if line and not line.startswith("#"):
                name, v = line.rsplit(" ", 1)
                values[name] = float(v)

        def total(metric, **labels):
            want = [f'{k}="{v}"' for k, v in labels.items()]
            return sum(v for k, v in values.items()
                       if k.split("{")[0] == metric and all(w in k for w in want))

        assert result["bytes_d2h"] > 0 and result["bytes_h2d"] > 0
        assert total("radixtier_copy_bytes_total", direction="d2h") == result["bytes_d2h"]
        assert total("radixtier_copy_bytes_total", direction="h2d") == result["bytes_h2d"]
        assert total("radixtier_snapshots_dropped_total") == result["snapshots_dropped"]
        assert total("radixtier_admission_latency_seconds_count") > 0
    finally:
        p.kill()
        p.wait()
