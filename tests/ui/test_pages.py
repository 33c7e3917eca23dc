"""The pages in a real browser (headless Chromium) against `runifold ui` serving SQLite and PostgreSQL stores."""

from __future__ import annotations

import json
import re
from typing import Any

from runifold import RunStatus
from tests.ui.app import BULK, GHOST, HOSTILE_REASON, HOSTILE_SENDER
from tests.ui.conftest import Served, runifold

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def rows(page: Any, table: str = "#runs") -> list[dict[str, str]]:
    """The body rows of ``table`` as {column header: cell text}; a runs list's status is its badge alone."""
    headers = page.locator(f"{table} thead th").all_inner_texts()
    found = [dict(zip(headers, row.locator("td").all_inner_texts(), strict=False))
             for row in page.locator(f"{table} tbody tr").all()]
    for row in found:
        if table == "#runs" and "status" in row:
            row["status"], _, row["status detail"] = row["status"].partition("\n")
    return found


def links_are_relative(page: Any) -> bool:
    """No link or form names an absolute path or another host: the view works under any prefix a proxy strips."""
    hrefs = page.locator("a[href], form[action]").evaluate_all(
        "els => els.map(e => e.getAttribute('href') ?? e.getAttribute('action'))")
    return bool(hrefs) and not any(h.startswith(("/", "http:", "https:")) for h in hrefs)


def test_runs_list_shows_each_status(served: Served, page: Any) -> None:
    """The runs page counts runs per status, and each status's link lists exactly its runs, with ISO-8601 times."""
    page.goto(served.url + "runs?refresh=0")
    counts = {s.value: int(page.locator(f'#counts a[data-status="{s.value}"] b').inner_text()) for s in RunStatus}
    assert counts == {"ready": 1 + BULK, "running": 2, "waiting": 1, "parked": 1, "diverged": 1, "completed": 4,
                      "failed": 1, "cancelled": 2}  # completed: order-done, approve-1, family-done and its child
    assert links_are_relative(page)
    served.shot(page, "runs")
    for status, ref in served.filled.refs.items():
        page.locator(f'#counts a[data-status="{status.value}"]').click()
        page.wait_for_load_state()
        listed = rows(page)
        assert listed and {r["status"] for r in listed} == {status.value}, (status, listed[:3])
        assert len(listed) == min(counts[status.value], 50)
        for row in listed[:5]:
            assert ISO.match(row["created (UTC)"]) and ISO.match(row["updated (UTC)"]), row
        page.fill('input[name="ref"]', ref)  # the status stays selected in the form
        page.click('form.filters button[type="submit"]')
        page.wait_for_load_state()
        [row] = rows(page)
        assert (row["checkpoint id"], row["status"]) == (ref, status.value)
        if status is RunStatus.RUNNING:
            holder, _, until = row["status detail"].rpartition(" until ")
            assert holder == "lease ui-test-holder" and ISO.match(until)
        elif status in (RunStatus.READY, RunStatus.WAITING, RunStatus.DIVERGED) and row["status detail"]:
            assert row["status detail"].startswith("due ") and ISO.match(row["status detail"][4:])
        if status is RunStatus.DIVERGED:
            assert row["status detail"]  # tried again a minute later
    page.goto(served.url + "runs?refresh=0&status=completed")
    done = {r["checkpoint id"]: r for r in rows(page)}
    assert re.match(r"^\d+ ms$|^\d+\.\d s$", done["order-done"]["duration"])  # finished: how long it took
    page.goto(served.url + "runs?refresh=0&status=waiting")
    assert rows(page)[0]["duration"].startswith("open ")  # unfinished: its age so far


def test_filters_by_name_version_and_checkpoint_id(served: Served, page: Any) -> None:
    """The filter form narrows the list by workflow name and version, and finds one run by checkpoint id or run id."""
    page.goto(served.url + "runs?refresh=0")
    page.fill('input[name="name"]', "approval")
    page.fill('input[name="version"]', "1")
    page.click('form.filters button[type="submit"]')
    page.wait_for_load_state()
    assert sorted(r["checkpoint id"] for r in rows(page)) == ["approve-1", "approve-waiting"]
    assert page.locator("#shown").inner_text().startswith("2 of 2 run(s)")
    page.goto(served.url + "runs?refresh=0&version=2")
    assert rows(page)[0]["run"] == "no runs match"
    page.goto(served.url + "runs?refresh=0&ref=pay-parked")
    [found] = rows(page)
    assert found["status"] == "parked"
    page.goto(served.url + f"runs?refresh=0&ref={found['run']}")
    assert [r["checkpoint id"] for r in rows(page)] == ["pay-parked"]
    page.goto(served.url + "runs?refresh=0&ref=pay-parked&status=failed")
    assert rows(page)[0]["run"] == "no runs match"


def test_failed_run_shows_its_traceback_and_retries(served: Served, page: Any) -> None:
    """A failed run's page shows the error, the failed step's traceback, and both attempts in the timeline."""
    page.goto(served.url + "run?ref=parse-failed")
    assert page.locator("#status").inner_text() == "failed"
    call_trace = page.locator("#call-traceback").inner_text()
    assert "Traceback (most recent call last)" in call_trace
    assert "in parse_amount" in call_trace and "ValueError: invalid literal for int() with base 10: '12 EUR'" in call_trace
    assert "StepFailedError" in page.locator("#failure + dl").inner_text()
    history = rows(page, "#history")
    failures = [r for r in history if r.get("event") == "step_failed"]
    assert [f["key"] for f in failures] == ["parse_amount#1", "parse_amount#1"]
    assert "attempt 1 raised ValueError: invalid literal" in failures[0]["what"] and "next attempt at" in failures[0]["what"]
    assert "attempt 2" in failures[1]["what"] and "no attempts left" in failures[1]["what"]
    assert failures[1]["call took"] != ""  # the second attempt, timed from the call's first event
    assert any(r.get("event") == "run_failed" for r in history)
    assert page.locator("#replay-verdict").inner_text().startswith("clean")
    usage = {r["what"]: r for r in rows(page, "#usage")}
    assert usage["steps"]["used"] == "2" and usage["steps"]["budget"].startswith("10000")
    assert links_are_relative(page)
    served.shot(page, "run-failed")


def test_parked_run_shows_its_ambiguous_effect_with_evidence(served: Served, page: Any) -> None:
    """A parked run's page names the ambiguous effect, its idempotency key, and the evidence that left it in doubt."""
    page.goto(served.url + "run?ref=pay-parked")
    run_id = page.locator("#run-id").inner_text()
    assert page.locator("#status").inner_text() == "parked"
    effect = page.locator('.effect[data-key="charge_card#1"]')
    text = effect.inner_text()
    assert "charge_card#1 is ambiguous" in text and f"{run_id}:charge_card#1" in text
    evidence = rows(page, '.effect[data-key="charge_card#1"] table')
    assert [e["event"] for e in evidence] == ["effect_started", "effect_unknown", "effect_reconciled",
                                              "effect_ambiguous"]
    assert "connection reset after the charge request was sent" in evidence[1]["what"]
    assert evidence[2]["what"] == "evidence: unknown (the provider's search API timed out)"
    assert "runifold resolve" in text and "nothing settles it now" not in text
    served.shot(page, "run-parked")
    # cancelled while its effect was ambiguous: the page says nothing can settle it now, and offers no resolve
    page.goto(served.url + "run?ref=pay-cancelled")
    assert page.locator("#status").inner_text() == "cancelled"
    text = page.locator('.effect[data-key="charge_card#1"]').inner_text()
    assert "charge_card#1 is ambiguous" in text and "runifold resolve" not in text
    assert "the run has finished: nothing settles it now; check the outside world by its idempotency key" in text


def test_run_pages_show_waits_who_resumed_and_the_replay_verdict(served: Served, page: Any) -> None:
    """Open waits with their due time; who signaled a run and why; who cancelled one; a diverged run's first key;
    a run's concurrency key and limit."""
    page.goto(served.url + "run?ref=approve-waiting")
    [wait] = rows(page, "#waits")
    assert wait["kind"] == "signal" and wait["signal"] == "approval" and ISO.match(wait["until (UTC)"])
    assert wait["when"].startswith("in 1d") or wait["when"].startswith("in 2d")
    assert page.locator("#replay-verdict").inner_text().startswith(
        "clean: code and history agree as far as the history goes")
    page.goto(served.url + "run?ref=approve-1")
    [received] = [r for r in rows(page, "#history") if r.get("event") == "signal_received"]
    assert received["who"] == "alice" and received["why"] == "stock checked by phone"
    assert "'approval' (sig-ok)" in received["what"]
    assert page.locator("#result").inner_text() == '{"first":4,"decision":{"approved":true}}'
    page.goto(served.url + "run?ref=order-cancelled")
    [cancelled] = [r for r in rows(page, "#history") if r.get("event") == "run_cancelled"]
    assert cancelled["who"] == "ops-carol" and cancelled["why"] == "customer withdrew the order"
    page.goto(served.url + "run?ref=evolving-diverged")
    assert page.locator("#status").inner_text() == "diverged"
    verdict = page.locator("#replay-verdict").inner_text()
    assert verdict.startswith("DIVERGED at add#1: history recorded") and "code called" in verdict
    served.shot(page, "run-diverged")
    page.goto(served.url + "run?ref=order-done")
    # (the line `runifold replay` prints, with what the workflow returned: helper-76 found the page said less)
    assert page.locator("#replay-verdict").inner_text().startswith("clean: code and history agree to the end (result ")
    assert page.locator("#parent").count() == 0  # no parent reference in its run_started: nothing shown
    assert page.locator("#concurrency").count() == 0  # enqueued without a concurrency key
    # a run whose worker died holding it: its lease is marked expired (helper-89: it looked alive)
    page.goto(served.url + "run?ref=order-stalled")
    assert page.locator("#lease-expired").inner_text().startswith("(expired: its worker stopped renewing it")
    page.goto(served.url + "run?ref=order-running")
    assert page.locator("#lease-expired").count() == 0
    page.goto(served.url + "runs?refresh=0&status=running")
    leases = {r["checkpoint id"]: r["status detail"] for r in rows(page)}
    assert leases["order-stalled"].endswith("(expired)") and not leases["order-running"].endswith("(expired)")
    page.goto(served.url + "run?ref=order-ready")
    assert page.locator("#concurrency").inner_text() == "key orders · at most 2 running at once"


def test_a_parent_and_its_child_link_to_each_other(served: Served, page: Any) -> None:
    """A run that started a child run links to it (with its status), and the child links back to its parent."""
    page.goto(served.url + "run?ref=family-done")
    parent_id = page.locator("#run-id").inner_text()
    children = page.locator("#children")
    assert "child.steps#1" in children.inner_text() and "completed" in children.inner_text()
    children.locator("a").first.click()
    page.wait_for_load_state()
    assert page.locator("#status").inner_text() == "completed"
    assert page.locator("#facts").inner_text().count("child:") == 1  # its checkpoint id names the parent's call
    page.locator("#parent").click()
    page.wait_for_load_state()
    assert page.locator("#run-id").inner_text() == parent_id
    served.shot(page, "run-parent")


def test_audit_escapes_a_hostile_attempt(served: Served, page: Any) -> None:
    """Every attempt is listed; a sender and reason holding ANSI escapes and HTML are shown as text, never run."""
    for path in ("audit?ref=approve-1", "audit"):
        page.goto(served.url + path)
        records = rows(page, "#audit")
        assert [r["verdict"] for r in sorted(records, key=lambda r: (r["signal id"], r["verdict"]))] == [
            "rejected:bad_signature", "rejected:invalid", "accepted", "duplicate"], records
        [hostile] = [r for r in records if r["signal id"] == "sig-hostile"]
        assert hostile["sender"] == HOSTILE_SENDER.replace("\x1b", "\\x1b")
        assert hostile["reason"] == HOSTILE_REASON.replace("\x1b", "\\x1b")
        assert "non-printable" in hostile["detail"]
        row = page.locator('#audit tbody tr[data-verdict="rejected:invalid"]')
        assert row.locator(".sender .ctl").all_inner_texts() == ["\\x1b"]
        assert row.locator(".reason .ctl").all_inner_texts() == ["\\x1b", "\\x1b"]
        assert page.locator("script").count() == 0 and page.locator("#audit img").count() == 0
        assert page.title() == "Audit · runifold"  # no script ran: it would have set the title
        assert all(ISO.match(r["at (UTC)"]) for r in records)
        assert links_are_relative(page)
        served.shot(page, "audit-run" if "ref=" in path else "audit")
    page.goto(served.url + "audit?ref=approve-1&verdict=rejected")
    assert {r["verdict"] for r in rows(page, "#audit")} == {"rejected:bad_signature", "rejected:invalid"}
    page.goto(served.url + f"audit?ref={GHOST}")  # no such run, but an attempt against that reference
    assert "(no such run)" in page.locator("h1").inner_text()
    assert [(r["signal id"], r["verdict"]) for r in rows(page, "#audit")] == [("sig-ghost", "rejected:unknown_run")]
    page.goto(served.url + "audit?ref=nobody-ever")
    assert page.locator("#error").inner_text().startswith("no run with id or checkpoint id 'nobody-ever'")


def test_paging_through_a_thousand_runs(served: Served, page: Any) -> None:
    """Following "next page" from the first page visits each of 1,000 runs once, newest first, as the store lists them."""
    listed = json.loads(runifold(served.store_url, "--json", "runs", "list", "--name", "bulk", "--limit",
                                 "1000").stdout)
    assert listed["total"] == BULK
    page.goto(served.url + "runs?refresh=0&name=bulk&limit=100")
    seen: list[str] = []
    for number in range(1, 11):
        assert page.locator("#shown").inner_text().startswith(f"100 of {BULK} run(s)")
        seen += page.locator("#runs tbody tr").evaluate_all("rows => rows.map(r => r.dataset.run)")
        if number == 5:
            served.shot(page, "runs-page-5")
        if number < 10:
            page.locator("#next").click()
            page.wait_for_load_state()
            assert f"page={number + 1}" in page.url and "name=bulk" in page.url
    assert page.locator("#next").count() == 0  # the last page has no next page
    assert seen == [r["run_id"] for r in listed["runs"]]
    assert len(set(seen)) == BULK
    page.locator("#newest").click()
    page.wait_for_load_state()
    assert page.locator("#runs tbody tr").first.get_attribute("data-run") == seen[0]


def test_the_runs_page_reloads_itself(served: Served, page: Any) -> None:
    """With auto-reload on, a run enqueued after the page loaded appears without any action; pausing stops reloads."""
    page.goto(served.url + "runs?refresh=1&name=steps")
    assert page.locator('meta[http-equiv="refresh"]').get_attribute("content") == "1"
    before = page.locator("#runs tbody tr").count()
    ref = f"late-{served.kind}"
    assert runifold(served.store_url, "enqueue", "steps", "1", "--input", '{"n": 9}', "--checkpoint-id",
                    ref).returncode == 0
    page.locator(f'#runs tbody tr:has-text("{ref}")').wait_for(timeout=20_000)
    assert page.locator("#runs tbody tr").count() == before + 1
    page.locator("#pause").click()
    page.wait_for_load_state()
    assert "refresh=0" in page.url and page.locator('meta[http-equiv="refresh"]').count() == 0
    assert page.locator("#resume").count() == 1
