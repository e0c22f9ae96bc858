"""What the study's small measurements predict at a user's scale (issue 26).

- ``cluster``: a cluster description file (YAML) as one typed, frozen ``Cluster``, every field with its source;
- ``terms``: the cost model, one function per part of a checkpoint and a restart, each with its form and why;
- ``fit``: the terms' constants fitted from the study's run folders (through ``restartbench.analysis``'s table);
- ``predict``: a preset, layout and engine on a cluster, every part with its range, bound and "assumed" marks;
- ``cli`` (``python -m restartbench.whatif``), ``plots``: the command and its figures;
- ``limits``, ``validation``: this machine's limits for its cluster file, and predictions set against runs
  (``bench/whatif_validation.py``).

docs/whatif.md says what is modelled and what is not.
"""
