"""``runifold drill``: the recovery drill (see docs/recovery-drill.md)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    return None
