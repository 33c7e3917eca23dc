"""Keys belong to the deployment: `runifold signal` verifies against the operator's key ring, and the audit cannot be faked."""

from __future__ import annotations

import json
import re
import shlex
import stat

from runifold import RunStatus
from tests.cli.conftest import ROOT, Cli, key_file, run_worker_until


def waiting(cli: Cli, ref: str = "g1") -> None:
    assert cli("enqueue", "gated", "1", "--input", '{"n": 1}', "--checkpoint-id", ref).returncode == 0
    run_worker_until(cli, ref, RunStatus.WAITING)


def test_keys_new_add_list_revoke(cli: Cli) -> None:
    """keys new writes a private sender file once; add trusts it in the ring; list shows no secret; revoke refuses it."""
    alice = cli.tmp / "alice.key"
    ring = cli.tmp / "ring.json"
    made = cli("keys", "new", "--as", "alice", "--key-id", "alice-1", "--out", str(alice))
    assert made.returncode == 0 and "wrote key alice-1 of alice" in made.stdout
    assert stat.S_IMODE(alice.stat().st_mode) == 0o600
    again = cli("keys", "new", "--as", "alice", "--key-id", "alice-2", "--out", str(alice))
    assert again.returncode == 2 and "already exists" in again.stderr
    assert json.loads(alice.read_text())[0]["key_id"] == "alice-1"  # not overwritten
    generated = json.loads(cli("keys", "new", "--as", "bob", "--out", str(cli.tmp / "bob.key"), "--json").stdout)
    assert generated["sender"] == "bob" and generated["key_id"].startswith("bob-")
    assert cli("keys", "add", str(alice), "--keys", str(ring)).returncode == 0
    assert stat.S_IMODE(ring.stat().st_mode) == 0o600
    assert cli("keys", "add", str(cli.tmp / "bob.key"), "--keys", str(ring)).returncode == 0
    twice = cli("keys", "add", str(alice), "--keys", str(ring))
    assert twice.returncode == 2 and "alice-1 already in the key ring" in twice.stderr
    listing = cli("keys", "list", "--keys", str(ring))
    assert listing.returncode == 0 and "alice-1" in listing.stdout and "active" in listing.stdout
    secret = json.loads(alice.read_text())[0]["secret"]
    assert secret not in listing.stdout and secret not in cli("keys", "list", "--keys", str(ring), "--json").stdout
    assert cli("keys", "revoke", "alice-1", "--keys", str(ring)).returncode == 0
    assert [(k["key_id"], k["revoked"]) for k in json.loads(cli("keys", "list", "--keys", str(ring), "--json").stdout)] \
        == [("alice-1", True), (generated["key_id"], False)]
    unknown = cli("keys", "revoke", "nobody-1", "--keys", str(ring))
    assert unknown.returncode == 2 and "no key id 'nobody-1'" in unknown.stderr
    # revoking it again says so, and signing with a file whose every key is revoked says that (helper-57)
    again = cli("keys", "revoke", "alice-1", "--keys", str(ring))
    assert again.returncode == 0 and "alice-1 in" in again.stdout and "was revoked already" in again.stdout
    revoked_file = cli.tmp / "alice-revoked.key"
    revoked_file.write_text(json.dumps([{**json.loads(alice.read_text())[0], "revoked": True}]))
    refused = cli("signal", "g1", "approval", "--signal-id", "s1", "--as", "alice", "--reason", "r",
                  "--key-file", str(revoked_file), "--keys", str(ring))
    assert refused.returncode == 2 and "every key of sender 'alice' here is revoked (alice-1)" in refused.stderr


def test_a_made_up_key_for_alice_is_refused(any_cli: Cli) -> None:
    """A key file with a made-up secret under alice's name is refused against the deployment's ring and audited as such."""
    cli = any_cli
    waiting(cli)
    ring = cli.tmp / "ring.json"
    assert cli("keys", "new", "--as", "alice", "--key-id", "alice-1", "--out", str(cli.tmp / "alice.key")).returncode == 0
    assert cli("keys", "add", str(cli.tmp / "alice.key"), "--keys", str(ring)).returncode == 0
    forged = key_file(cli.tmp, "forged.json", [{"key_id": "alice-1", "sender": "alice", "secret": b"made-up-secret-123456"}])
    args = ["signal", "g1", "approval", "--payload", '{"approved": true}', "--signal-id", "s1", "--as", "alice",
            "--reason", "trust me"]
    refused = cli(*args, "--key-file", forged, env={"RUNIFOLD_KEYS": str(ring)})
    assert refused.returncode == 1 and "signal rejected (bad_signature)" in refused.stderr
    self_verified = cli(*args, "--key-file", forged)  # the sender's own file can no longer vouch for itself
    assert self_verified.returncode == 2 and "--keys RING" in self_verified.stderr
    other = key_file(cli.tmp, "mallory.json", [{"key_id": "mallory-1", "sender": "alice", "secret": b"m" * 32}])
    unknown_key = cli(*args, "--key-file", other, "--keys", str(ring))
    assert unknown_key.returncode == 1 and "unknown_key" in unknown_key.stderr
    sent = cli(*args, "--key-file", str(cli.tmp / "alice.key"), "--keys", str(ring))
    assert sent.returncode == 0 and "accepted" in sent.stdout
    verdicts = [r["verdict"] for r in json.loads(cli("audit", "g1", "--json").stdout)]
    assert verdicts == ["rejected:bad_signature", "rejected:unknown_key", "accepted"]
    assert cli("keys", "revoke", "alice-1", "--keys", str(ring)).returncode == 0
    revoked = cli(*args[:6], "s2", *args[7:], "--key-file", str(cli.tmp / "alice.key"), "--keys", str(ring))
    assert revoked.returncode == 1 and "revoked_key" in revoked.stderr


def test_the_audit_prints_what_was_sent_escaped(any_cli: Cli) -> None:
    """A rejected attempt whose fields hold ANSI escapes and line breaks prints as one escaped row, never a fake line."""
    cli = any_cli
    waiting(cli)
    ring = key_file(cli.tmp, "ring.json", [{"key_id": "alice-1", "sender": "alice", "secret": b"a" * 32}])
    fake = "x\x1b[2K\r2026-01-01T00:00:00.000Z  accepted  approval  s9  alice"
    forged = key_file(cli.tmp, "forged.json", [{"key_id": "alice-1", "sender": "alice", "secret": b"f" * 32}])
    result = cli("signal", "g1", "approval", "--signal-id", "s1", "--as", "alice", "--reason", "line 1\nline 2" + fake,
                 "--key-file", forged, "--keys", ring)
    assert result.returncode == 1
    audit = cli("audit", "g1")
    assert audit.returncode == 0 and "\x1b" not in audit.stdout and "\r" not in audit.stdout
    rows = audit.stdout.splitlines()[2:]
    assert len(rows) == 1 and rows[0].split()[1] == "rejected:bad_signature"
    assert "line 1\\nline 2x\\x1b[2K\\r2026-01-01" in rows[0]
    assert json.loads(cli("audit", "g1", "--json").stdout)[0]["reason"] == "line 1\nline 2" + fake  # stored as sent


def test_oversized_signals_are_refused_before_anything_is_stored(cli: Cli) -> None:
    """A 100 KB signal id or reason is refused (exit 1, too_large) and the audit keeps it cut to the limits."""
    waiting(cli)
    ring = key_file(cli.tmp, "ring.json", [{"key_id": "alice-1", "sender": "alice", "secret": b"a" * 32}])
    base = ["signal", "g1", "approval", "--as", "alice", "--key-file", ring, "--keys", ring]
    big_id = cli(*base, "--signal-id", "i" * 100_000, "--reason", "r")
    assert big_id.returncode == 1 and "signal rejected (too_large): signal_id has 100,000 characters" in big_id.stderr
    big_reason = cli(*base, "--signal-id", "s1", "--reason", "r" * 100_000)  # an argument holds at most 128 KiB
    assert big_reason.returncode == 1 and "too_large" in big_reason.stderr
    records = json.loads(cli("audit", "g1", "--json").stdout)
    assert [len(r["signal_id"]) for r in records] == [200, 2] and len(records[1]["reason"]) == 2_000


def test_a_reused_signal_id_with_another_payload_is_a_conflict(any_cli: Cli) -> None:
    """Resending a signal id with the same payload is a duplicate; with another payload it is refused (exit 1) and audited."""
    cli = any_cli
    waiting(cli)
    ring = key_file(cli.tmp, "ring.json", [{"key_id": "alice-1", "sender": "alice", "secret": b"a" * 32}])
    base = ["signal", "g1", "approval", "--signal-id", "s1", "--as", "alice", "--key-file", ring, "--keys", ring,
            "--reason", "ok"]
    assert cli(*base, "--payload", '{"approved": true}').returncode == 0
    assert "duplicate" in cli(*base, "--payload", '{"approved": true}').stdout
    conflict = cli(*base, "--payload", '{"approved": false}')
    assert conflict.returncode == 1 and "signal rejected (conflict)" in conflict.stderr
    assert [r["verdict"] for r in json.loads(cli("audit", "g1", "--json").stdout)] == [
        "accepted", "duplicate", "rejected:conflict"]
    run_worker_until(cli, "g1", RunStatus.COMPLETED)
    assert '"approved":true' in cli("history", "g1").stdout


def test_the_readme_signal_example_runs_as_written(cli: Cli) -> None:
    """The README's key and signal commands, run in order in a fresh folder, deliver alice's approval and nothing else."""
    readme = (ROOT / "README.md").read_text()
    [block] = [b for b in re.findall(r"```sh\n(.*?)```", readme, re.S) if "runifold keys new" in b]
    waiting(cli, "ord_7")
    folder = cli.tmp / "operator"
    folder.mkdir()
    ran = []
    for line in block.replace("\\\n", " ").splitlines():
        command = line.split("  #")[0].strip()
        if not command.startswith("runifold "):
            continue
        argv = shlex.split(re.sub(r"\bRUN\b", "ord_7", command))
        result = cli(*argv[1:], cwd=folder, env={"RUNIFOLD_KEYS": "deployment-keys.json"})
        assert result.returncode == 0, (command, result.stderr)
        ran.append(argv[1])
    assert ran[:3] == ["keys", "keys", "signal"]
    assert [r["verdict"] for r in json.loads(cli("audit", "ord_7", "--json").stdout)] == ["accepted"]
    assert stat.S_IMODE((folder / "alice.key").stat().st_mode) == 0o600
