"""``runifold ui``: a read-only web view of runs, histories and signal audits.

Needs the ``ui`` extra (Starlette, uvicorn, Jinja2): ``pip install
'/path/to/runifold[ui]'`` from a checkout, or ``'runifold[ui]'`` from a package
index. :func:`create_app` returns the view as an ASGI application over an
open store, for the ``runifold ui`` command or to mount in an application of
your own (behind your own authentication).

Pages (each has the same data as JSON under ``api/``):

* ``runs``: runs newest first, filtered by status, name, version, run or
  checkpoint id; counts per status; paging; reloads itself (``?refresh=``);
* ``run?ref=``: the checkpoint, failure and traceback, open waits, pending and
  ambiguous effects with their evidence, the history as a timeline, and the
  replay verdict against the loaded workflows;
* ``audit`` and ``audit?ref=``: every signal attempt, overall or for one run.
"""

from runifold.ui._app import create_app

__all__ = ["create_app"]
