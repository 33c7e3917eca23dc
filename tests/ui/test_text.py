"""How the view shows what it reads, without a browser: escaping, the timeline's durations, a parent reference."""

from __future__ import annotations


from runifold.stores._open import redacted as store_label
from runifold.history import Entry, RunStarted, SignalReceived, SignalWaitStarted, StepCompleted, StepFailed
from runifold.ui._app import show, show_lines
from runifold.ui._timeline import timeline


def test_show_escapes_html_and_shows_control_characters() -> None:
    """HTML is escaped; ESC, CR, NUL and a bidi override become visible escapes inside a marked span."""
    html = str(show("<b onclick='x'>\x1b[31mred\r\x00\u202e</b>"))
    assert html == ("&lt;b onclick=&#39;x&#39;&gt;<span class=\"ctl\" title=\"a control character, shown escaped\">"
                    "\\x1b</span>[31mred" + "".join(
                        f'<span class="ctl" title="a control character, shown escaped">{e}</span>'
                        for e in ("\\r", "\\x00", "\\u202e")) + "&lt;/b&gt;")
    assert str(show(None)) == "" and str(show(3)) == "3"
    assert str(show_lines("a\n<b>\x1b")).split("\n")[1].startswith("&lt;b&gt;")


def test_store_label_hides_a_password() -> None:
    """A PostgreSQL URL's password is replaced; other URLs are shown as given."""
    assert store_label("postgresql://ops:s3cret@db.internal:5432/runs") == "postgresql://ops:***@db.internal:5432/runs"
    assert store_label("postgresql://ops@db/runs") == "postgresql://ops@db/runs"
    assert store_label("sqlite:///runifold-workflows.db") == "sqlite:///runifold-workflows.db"
    # libpq's query form too (helper-87: runs list's next-page hint and the store's errors printed it in clear)
    assert store_label("postgresql://ops@db/runs?password=s3cret&sslmode=disable") == (
        "postgresql://ops@db/runs?password=***&sslmode=disable")
    assert store_label("postgresql://ops:a@db/runs?PASSWORD=b") == "postgresql://ops:***@db/runs?PASSWORD=***"
    assert store_label("postgresql://db/runs?sslmode=require") == "postgresql://db/runs?sslmode=require"


def test_timeline_times_gaps_calls_and_names_who_acted() -> None:
    """``gap`` is the time since the previous event, ``took`` since the call's first event; a signal's sender and reason."""
    entries = [
        Entry(1, 100.0, RunStarted(name="w", version=1, input={})),
        Entry(2, 101.5, StepFailed(key="s#1", error="ValueError: no", attempt=1, retry_at=103.0)),
        Entry(3, 104.0, StepCompleted(key="s#1", output=1, attempt=2)),
        Entry(4, 104.0, SignalWaitStarted(key="wait.ok#1", name="ok")),
        Entry(5, 164.0, SignalReceived(key="wait.ok#1", name="ok", payload=None, signal_id="s1", sender="alice",
                                       reason="looks right", received_at=163.0)),
    ]
    rows = timeline(entries)
    assert [(r["gap"], r["took"]) for r in rows] == [(None, None), (1.5, None), (2.5, 2.5), (0.0, None),
                                                     (60.0, 60.0)]
    assert rows[1]["what"].startswith("attempt 1 raised ValueError: no; next attempt at 1970-01-01T00:01:43.000Z")
    assert (rows[4]["who"], rows[4]["why"]) == ("alice", "looks right")


def test_a_child_runs_parent_is_read_from_run_started() -> None:
    """The parent a run page links to is the ``parent_run_id`` its ``run_started`` carries (none for other runs)."""
    from runifold.history import Entry, RunStarted, fold

    def first(**extra: str) -> list[Entry]:
        return [Entry(1, 0.0, RunStarted(name="child", version=1, input={}, **extra))]

    assert fold(first()).parent_run_id is None
    assert fold(first(parent_run_id="run_0123")).parent_run_id == "run_0123"


def test_the_timeline_says_a_childs_start_cancelled_under_way_is_recorded() -> None:
    """A child's start cancelled while its enqueue was under way runs on: the timeline does not say that nothing
    more is recorded for it (its child_started follows)."""
    from runifold.history import CallCancelled, ChildStarted

    entries = [Entry(1, 0.0, RunStarted(name="w", version=1, input={})),
               Entry(2, 0.2, CallCancelled(key="child.kid#1", kind="child", attempt=1, ran=True)),
               Entry(3, 0.6, ChildStarted(key="child.kid#1", run_id="run_01", name="kid", version=1,
                                          checkpoint_id="child:run_00:child.kid#1")),
               Entry(4, 0.7, CallCancelled(key="s#1", kind="step", attempt=1, ran=False))]
    rows = timeline(entries)
    assert rows[1]["what"] == "cancelled by workflow code while the child run was being started: its start is recorded"
    assert rows[3]["what"].endswith("nothing more is recorded for it")
