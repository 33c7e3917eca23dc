"""The ``runifold`` command line (``python -m runifold.cli`` or the ``runifold`` script)."""
