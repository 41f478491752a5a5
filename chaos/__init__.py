"""The verifier (Jepsen's method): run a real cluster under a seeded nemesis, collect a history,
check it offline.

- ``tasks``    the side-effect-logging task ``chaos.record`` (node processes import it through
               ``SCHEDULER_TASK_MODULES=chaos.tasks``; production never registers it);
- ``record``   the history format (plain dataclasses, JSON round trip) the checker reads;
- ``checker``  a pure checker that reports every violation of docs/guarantees.md with its
               evidence (no Django imports), with rule families in ``attempts``, ``intent``,
               ``rules/``;
- ``history``  reads a history out of the database, the side-effect log and the node logs;
- ``faults``   the fault kinds; ``nemesis`` the seeded fault injector; ``links`` each node's TCP
               paths to its services (hang, one-way, slow, reset); ``processes`` the node
               processes and their clocks; ``mariadb_server``/``redis_server`` private servers;
               ``operator_actions`` the concurrent operator;
- ``runner``   one chaos run from start to report (``python manage.py chaos`` runs it in a child
               process connected to the run's own database).
"""
