"""The verifier (Jepsen's method): run a real cluster under a seeded nemesis, collect a history,
check it offline.

- ``tasks``    the side-effect-logging task ``chaos.record`` (node processes import it through
               ``SCHEDULER_TASK_MODULES=cluster.verify.tasks``; production never registers it);
- ``checker``  the history format (plain dataclasses, JSON round trip) and a pure checker that
               reports every violation of DESIGN §6 with its evidence (no Django imports);
- ``history``  reads a history out of the database, the side-effect log and the node logs;
- ``nemesis``  the seeded fault injector, the private Redis servers, the cuttable database proxy
               and the concurrent operator;
- ``runner``   one chaos run from start to report (``python manage.py chaos`` runs it in a child
               process connected to the run's own database).
"""
