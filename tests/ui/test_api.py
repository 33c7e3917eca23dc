"""The JSON behind each page (the CLI's --json shapes), the view's refusals and headers, and the `ui` command itself."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.ui.conftest import Served, cli_env, runifold, start_ui, stop_ui


def get(url: str, method: str = "GET", host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method, headers={} if host is None else {"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def get_json(url: str) -> Any:
    status, headers, body = get(url)
    assert status == 200 and headers["content-type"] == "application/json", (status, body)
    return json.loads(body)


def cli_json(served: Served, *args: str) -> Any:
    result = runifold(served.store_url, "--json", *args)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def test_json_endpoints_return_what_the_cli_prints(served: Served) -> None:
    """runs list, runs show, history, replay and audit: the endpoint's data is the CLI's --json output (plus keys)."""
    page = get_json(served.url + "api/runs?limit=20&status=ready")
    assert set(page) == {"total", "next_after", "runs", "counts", "now"}
    # the counts follow a reference filter too (helper-41: they counted every run of the store)
    named = get_json(served.url + "api/runs?ref=parse-failed")
    assert named["total"] == 1 and sum(named["counts"].values()) == 1 and named["counts"]["failed"] == 1
    assert {k: page[k] for k in ("total", "next_after", "runs")} == cli_json(served, "runs", "list", "--limit", "20",
                                                                              "--status", "ready")
    for ref in ("parse-failed", "pay-parked", "approve-1", "evolving-diverged"):
        shown = get_json(served.url + f"api/run?ref={ref}")
        printed = cli_json(served, "runs", "show", ref)  # with the app: its budget too
        assert set(printed) == {"run", "checkpoint", "children", "failure", "budget"}
        assert {k: shown[k] for k in printed} == printed
        assert get_json(served.url + f"api/history?ref={ref}") == cli_json(served, "history", ref)
        status, _, body = get(served.url + f"api/replay?ref={ref}")
        assert status == 200 and json.loads(body) == cli_json(served, "replay", ref)[0]
        assert get_json(served.url + f"api/audit?ref={ref}")["records"] == cli_json(served, "audit", ref)
    parked = get_json(served.url + "api/run?ref=pay-parked")
    assert [(e["key"], e["state"]) for e in parked["effects"]] == [("charge_card#1", "ambiguous")]
    assert parked["budget"]["max_steps"] == 10_000 and parked["parent"] is None
    overall = get_json(served.url + "api/audit?verdict=rejected")
    assert sorted(r["signal_id"] for r in overall["records"]) == ["sig-forged", "sig-hostile"]


def test_the_view_is_read_only_and_refuses_bad_requests(served: Served) -> None:
    """Only GET is served; every response forbids scripts and framing; bad parameters are 400, unknown runs 404."""
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        assert get(served.url + "runs", method)[0] == 405
        assert get(served.url + "api/run?ref=order-done", method)[0] == 405
    status, headers, _ = get(served.url + "runs?refresh=0")
    assert status == 200 and "script-src" not in headers["content-security-policy"]
    assert "default-src 'none'" in headers["content-security-policy"] and headers["x-frame-options"] == "DENY"
    assert get(served.url + "api/runs?status=stuck")[0] == 400
    assert get(served.url + "api/runs?limit=100000")[0] == 400
    assert get(served.url + "api/runs?version=two")[0] == 400
    # every version the stores and the command line take (helper-36: 1,500,000,000 was 400 here)
    assert get(served.url + "api/runs?version=2147483647")[0] == 200
    status, _, body = get(served.url + "api/runs?version=2147483648")
    assert status == 400 and "from 1 to 2,147,483,647" in json.loads(body)["error"]
    # as the command line refuses them (helper-33: a NUL reference was 503 on PostgreSQL and 404 on SQLite, and
    # after=zzz gave the first page)
    status, _, body = get(served.url + "api/runs?after=zzz")
    assert status == 400 and "after must be a run id" in json.loads(body)["error"]
    # helper-41: the audit ignored a bad after=, and escapes that are not UTF-8 became U+FFFD and matched nothing
    assert get(served.url + "api/audit?after=zzz")[0] == 400
    for query in ("api/runs?name=%ED%A0%80", "api/run?ref=%ff", "run?ref=%C3"):
        status, _, body = get(served.url + query)
        assert status == 400 and b"not valid UTF-8" in body, query
    assert get(served.url + "api/runs?name=caf%C3%A9")[0] == 200
    assert get(served.url + "favicon.ico")[0] == 204  # (a 404 in the browser's console on every page: helper-41)
    for query in ("api/run?ref=a%00b", "api/runs?name=a%00b", "run?ref=a%00b"):
        assert get(served.url + query)[0] == 400, query
    status, _, body = get(served.url + "api/run?ref=no-such-run")
    assert status == 404 and "no-such-run" in json.loads(body)["error"]
    status, _, body = get(served.url + "run?ref=%3Cb%3Eno-such%3C%2Fb%3E")
    assert status == 404 and b"&lt;b&gt;no-such&lt;/b&gt;" in body and b"<b>no-such" not in body
    status, headers, _ = get(served.url.rstrip("/") + "/")
    assert status == 200  # the root redirects (relatively: a proxy may serve the view under any prefix) to runs
    with urllib.request.urlopen(served.url.rstrip("/") + "/?status=failed", timeout=30) as response:
        assert response.url.endswith("/runs?status=failed")  # with the filters it was given
    # listening on this machine only, it answers only requests that name this machine: a page of another site
    # whose name resolves here (DNS rebinding) got the whole JSON (helper-57)
    port = served.url.rstrip("/").rpartition(":")[2]
    for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.attacker.example", ""):
        status, _, body = get(served.url + "api/runs", host=host)
        assert status == 400 and b"answers requests for 127.0.0.1, ::1, localhost only" in body, host
    for host in (f"127.0.0.1:{port}", f"LOCALHOST:{port}", "localhost", f"[::1]:{port}"):
        assert get(served.url + "api/runs", host=host)[0] == 200, host


def test_ui_without_the_extra_says_how_to_install_it(tmp_path: Path) -> None:
    """Without Starlette, `runifold ui` exits 2 with one line naming the extra."""
    fake = tmp_path / "no-extra" / "starlette"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'starlette'\", name='starlette')\n")
    db = tmp_path / "ui.db"
    assert runifold(f"sqlite:///{db}", "migrate").returncode == 0
    env = cli_env(f"sqlite:///{db}")
    env["PYTHONPATH"] = f"{fake.parent}:{env['PYTHONPATH']}"
    result = runifold(f"sqlite:///{db}", "ui", "--port", "0", env=env)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "runifold: error: `runifold ui` needs the ui extra, which is not installed (no module 'starlette'): "
        "pip install '/path/to/runifold[ui]' from a checkout, or 'runifold[ui]' from a package index"]


def test_ui_command_binds_loopback_and_reports_its_errors_in_one_line(tmp_path: Path) -> None:
    """By default the view listens on 127.0.0.1; a busy port and a missing store are one-line errors (exit 2)."""
    url = f"sqlite:///{tmp_path / 'ui.db'}"
    missing = runifold(url, "ui", "--port", "0")
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    assert "no SQLite store" in missing.stderr and not (tmp_path / "ui.db").exists()
    assert runifold(url, "migrate").returncode == 0
    proc, address = start_ui(url)
    try:
        assert address.startswith("http://127.0.0.1:")
        port = int(address.rstrip("/").rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass
        busy = runifold(url, "ui", "--port", str(port))
        assert busy.returncode == 2 and busy.stderr.startswith(f"runifold: error: cannot listen on 127.0.0.1:{port}")
        assert len(busy.stderr.strip().splitlines()) == 1
        status, _, body = get(address + "runs")
        assert status == 200 and b"no runs match" in b" ".join(body.split())  # an empty store: an empty list
    finally:
        code, out, err = stop_ui(proc)
    assert code == 0 and out.strip() == "runifold ui: stopped", (code, out, err)
    # a proxy that passes its own host name on (oauth2-proxy) is let through by --allow-host; a refusal carries the
    # security headers too (review)
    proc, address = start_ui(url, "--allow-host", "Runifold.example.com,ops.example.com")
    try:
        assert get(address + "api/runs", host="runifold.example.com:443")[0] == 200
        assert get(address + "api/runs", host="ops.example.com")[0] == 200
        status, headers, _ = get(address + "api/runs", host="attacker.example")
        assert status == 400 and headers["x-content-type-options"] == "nosniff" and "default-src 'none'" in \
            headers["content-security-policy"]
    finally:
        stop_ui(proc)
    bad = runifold(url, "ui", "--port", "0", "--allow-host", "a b")
    assert bad.returncode == 2 and "'a b' is not a host name" in bad.stderr
