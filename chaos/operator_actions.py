"""The operator of a chaos run: concurrent actions through the REST API, as people would take them
while the cluster is under faults."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from chaos.record import ApiAnomaly, Deletion, Fault, Requested, ScheduleEdit

API_TRIGGER = "api_trigger"
API_ENQUEUE = "api_enqueue"
API_PAUSE_RESUME = "api_pause_resume"
API_EDIT = "api_edit"
API_CONCURRENT_EDIT = "api_concurrent_edit"
API_DELETE_RECREATE = "api_delete_recreate"
API_SCHEDULE_EDIT = "api_schedule_edit"
OPERATOR_KINDS = (
    API_SCHEDULE_EDIT,
    API_TRIGGER,
    API_ENQUEUE,
    API_PAUSE_RESUME,
    API_EDIT,
    API_CONCURRENT_EDIT,
    API_DELETE_RECREATE,
)
# The intervals the operator switches its edited job between (seconds).
EDIT_INTERVALS = (1, 2, 3)
# An enqueued run is due now or this many seconds ahead.
ENQUEUE_AHEAD_S = (0.0, 3.0)
OPERATOR_EVERY_S = (0.7, 2.5)
# The share of actions that enqueue a burst of runs of a flow-controlled job, and its size.
FLOW_BURST_SHARE = 0.2
FLOW_BURST = (3, 6)
PAUSED_FOR_S = (1.5, 4.0)


class Unavailable(Exception):
    """The API answered 503 with Retry-After: the database is down, nothing was written — the
    contract for an outage, not an anomaly. The action is dropped."""


class Operator:
    """Concurrent operator actions through the REST API, from this process, against the run's
    database: trigger a run, enqueue runs (due now or soon), pause and later resume a job, edit
    it, race two edits on one version (exactly one may win; the other gets 409), and delete a
    scratch job of its own and create it again. Every action is logged as a fault; the runs it
    asked for and the jobs it deleted go to the history (the checker holds the cluster to them);
    an answer out of the contract (a 5xx, both racing edits winning) is an API anomaly."""

    def __init__(
        self,
        *,
        token: str,
        job_ids: Sequence[int],
        seed: int,
        say: Callable[[str], None],
        scratch: dict[str, Any] | None = None,
        flow_job_ids: Sequence[int] = (),
    ):
        self.token = token
        self.job_ids = list(job_ids)
        # Jobs under flow control (a limit, a rate): enqueued in bursts beyond what they may run
        # at once, so their limits hold runs back.
        self.flow_job_ids = list(flow_job_ids)
        self.rng = random.Random(seed)
        self.say = say
        self.scratch = scratch  # the definition of the job it deletes and creates again
        self._scratch_id: int | None = None
        self._scratch_made = 0
        self.faults: list[Fault] = []
        self.anomalies: list[ApiAnomaly] = []
        self.requested: list[Requested] = []
        self.deleted: list[Deletion] = []
        self.edits: list[ScheduleEdit] = []
        self.unavailable = 0  # actions dropped on a 503 (the database down)
        self._edited: dict[str, Any] | None = None  # the job whose interval it edits
        self.stop = threading.Event()
        self._paused: dict[int, float] = {}  # job id -> when to resume it
        self._thread = threading.Thread(target=self._loop, name="operator", daemon=True)

    def client(self) -> Any:
        from rest_framework.test import APIClient

        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Token {self.token}")
        return api

    def start(self) -> None:
        """Create the job whose schedule it edits (when it has a scratch definition), then act."""
        if self.scratch is not None:
            self._create_edited(self.client())
        self._thread.start()

    def _create_edited(self, api: Any) -> None:
        from django.db import connection

        body = {**self.scratch, "name": "chaos-edited", "interval_seconds": EDIT_INTERVALS[0]}
        sent = time.time()
        created = self._call(api, "post", "/api/jobs/", API_SCHEDULE_EDIT, data=body)
        if created.status_code != 201:
            self._anomaly(API_SCHEDULE_EDIT, f"create of chaos-edited: {created.status_code}")
            connection.close()
            return
        job = created.json()
        patched = self._call(
            api,
            "patch",
            f"/api/jobs/{job['id']}/",
            API_SCHEDULE_EDIT,
            data={"kwargs": {**body["kwargs"], "job_id": job["id"]}, "version": job["version"]},
        )
        self._edited = patched.json()
        # Its first schedule counts from its creation.
        self.edits.append(ScheduleEdit(job["id"], sent, time.time(), EDIT_INTERVALS[0]))
        connection.close()

    def _edit_schedule(self, api: Any, start: float) -> None:
        """Move the edited job to another interval: it must follow it from the next slot."""
        if self._edited is None:
            return
        job = self._edited
        interval = self.rng.choice([i for i in EDIT_INTERVALS if i != job["interval_seconds"]])
        response = self._call(
            api,
            "patch",
            f"/api/jobs/{job['id']}/",
            API_SCHEDULE_EDIT,
            data={"interval_seconds": interval, "version": job["version"]},
        )
        answered = time.time()
        if response.status_code == 200:
            self._edited = response.json()
            self.edits.append(ScheduleEdit(job["id"], start, answered, interval))
        else:
            self._anomaly(API_SCHEDULE_EDIT, f"edit of {job['name']}: {response.status_code}")
        self._record(API_SCHEDULE_EDIT, job["id"], start, f"every {interval} s")

    def close(self, timeout: float = 30.0) -> None:
        """Stop acting and resume every job still paused (the checker reads pause windows)."""
        self.stop.set()
        self._thread.join(timeout)
        api = self.client()
        for job_id in list(self._paused):
            for _ in range(30):  # the database may still be coming back
                try:
                    self._call(api, "post", f"/api/jobs/{job_id}/resume/", API_PAUSE_RESUME)
                    break
                except Unavailable:
                    time.sleep(1.0)
            self._paused.pop(job_id, None)
        from django.db import connection

        connection.close()

    def _loop(self) -> None:
        from django.db import connection

        api = self.client()
        try:
            while not self.stop.wait(self.rng.uniform(*OPERATOR_EVERY_S)):
                try:
                    self._act(api)
                except Unavailable as exc:
                    self.unavailable += 1
                    self.say(f"operator: {exc} (the database is down): action dropped")
                    connection.close()
                except Exception as exc:  # an action must never end the run: it is a finding
                    self._anomaly("operator", repr(exc))
                    connection.close()
        finally:
            connection.close()

    def _call(self, api: Any, method: str, path: str, action: str, **kwargs: Any) -> Any:
        if method != "get":
            kwargs["format"] = "json"
        response = getattr(api, method)(path, **kwargs)
        if response.status_code == 503 and response.headers.get("Retry-After"):
            raise Unavailable(
                f"{method.upper()} {path}: 503, Retry-After {response['Retry-After']}"
            )
        if response.status_code >= 500:
            self._anomaly(action, f"{method.upper()} {path}: {response.status_code}")
        return response

    def _anomaly(self, action: str, detail: str) -> None:
        self.anomalies.append(ApiAnomaly(time.time(), action, detail))
        self.say(f"API anomaly: {action}: {detail}")

    def _act(self, api: Any) -> None:
        now = time.time()
        for job_id, due in list(self._paused.items()):
            if due <= now:
                start = time.time()
                self._call(api, "post", f"/api/jobs/{job_id}/resume/", API_PAUSE_RESUME)
                del self._paused[job_id]
                self._record(API_PAUSE_RESUME, job_id, start, "resume")
        roll = self.rng.random()
        job_id = self.rng.choice(self.job_ids)
        start = time.time()
        if self.flow_job_ids and self.rng.random() < FLOW_BURST_SHARE:
            self._enqueue(
                api, self.rng.choice(self.flow_job_ids), start, count=self.rng.randint(*FLOW_BURST)
            )
            return
        if roll < 0.25:
            response = self._call(api, "post", f"/api/jobs/{job_id}/trigger/", API_TRIGGER)
            answered = time.time()
            if response.status_code == 201:
                run = response.json()["id"]
                self.requested.append(
                    Requested(run, job_id, API_TRIGGER, start, answered, answered)
                )
            self._record(API_TRIGGER, job_id, start)
        elif roll < 0.4:
            self._enqueue(api, job_id, start)
        elif roll < 0.5:
            self._delete_recreate(api, start)
        elif roll < 0.58:
            self._edit_schedule(api, start)
        elif roll < 0.7:
            current = self._call(api, "get", f"/api/jobs/{job_id}/", API_EDIT).json()
            self._call(
                api,
                "patch",
                f"/api/jobs/{job_id}/",
                API_EDIT,
                data={"description": f"edited at {start:.3f}", "version": current["version"]},
            )
            self._record(API_EDIT, job_id, start)
        elif roll < 0.85:
            self._race(api, job_id, start)
        elif job_id not in self._paused:
            self._call(api, "post", f"/api/jobs/{job_id}/pause/", API_PAUSE_RESUME)
            self._paused[job_id] = time.time() + self.rng.uniform(*PAUSED_FOR_S)
            self._record(API_PAUSE_RESUME, job_id, start, "pause")

    def _enqueue(self, api: Any, job_id: int, start: float, count: int | None = None) -> None:
        from datetime import UTC, datetime

        ahead = [
            round(self.rng.uniform(*ENQUEUE_AHEAD_S), 2)
            for _ in range(count or self.rng.randint(1, 3))
        ]
        runs = [
            {"run_at": datetime.fromtimestamp(start + s, tz=UTC).isoformat()} if s else {}
            for s in ahead
        ]
        response = self._call(
            api, "post", f"/api/jobs/{job_id}/enqueue/", API_ENQUEUE, data={"runs": runs}
        )
        answered = time.time()
        if response.status_code == 201:
            for run, seconds in zip(response.json()["ids"], ahead, strict=True):
                due = max(answered, start + seconds)
                self.requested.append(Requested(run, job_id, API_ENQUEUE, start, answered, due))
        elif response.status_code < 500:
            self._anomaly(API_ENQUEUE, f"job {job_id}: enqueue answered {response.status_code}")
        self._record(API_ENQUEUE, job_id, start, f"{len(runs)} runs")

    def _delete_recreate(self, api: Any, start: float) -> None:
        """Delete the scratch job (if there is one), else create it: its bodies must stop with the
        deletion, and the new one runs on its own."""
        if self.scratch is None:
            return
        if self._scratch_id is not None:
            job_id, self._scratch_id = self._scratch_id, None
            response = self._call(api, "delete", f"/api/jobs/{job_id}/", API_DELETE_RECREATE)
            answered = time.time()
            if response.status_code == 204:
                self.deleted.append(Deletion(job_id, start, answered))
            else:
                self._anomaly(
                    API_DELETE_RECREATE, f"delete of job {job_id}: {response.status_code}"
                )
            self._record(API_DELETE_RECREATE, job_id, start, "delete")
            return
        self._scratch_made += 1
        body = {**self.scratch, "name": f"{self.scratch['name']}-{self._scratch_made}"}
        created = self._call(api, "post", "/api/jobs/", API_DELETE_RECREATE, data=body)
        if created.status_code != 201:
            self._anomaly(API_DELETE_RECREATE, f"create of {body['name']}: {created.status_code}")
            return
        job = created.json()
        # The task logs its job's id (known only now): until this edit its bodies log none.
        self._call(
            api,
            "patch",
            f"/api/jobs/{job['id']}/",
            API_DELETE_RECREATE,
            data={"kwargs": {**body["kwargs"], "job_id": job["id"]}, "version": job["version"]},
        )
        self._scratch_id = job["id"]
        self._record(API_DELETE_RECREATE, job["id"], start, "create")

    def _race(self, api: Any, job_id: int, start: float) -> None:
        """Two operators edit the same job from the same version at the same moment."""
        from django.db import connection

        version = self._call(api, "get", f"/api/jobs/{job_id}/", API_CONCURRENT_EDIT).json()[
            "version"
        ]
        barrier = threading.Barrier(2)
        statuses: list[int] = []

        def edit(which: int) -> None:
            try:
                other = self.client()
                barrier.wait(timeout=5)
                response = self._call(
                    other,
                    "patch",
                    f"/api/jobs/{job_id}/",
                    API_CONCURRENT_EDIT,
                    # Both edits really change the job (an edit to the value it already has
                    # is a no-op that rightly succeeds), and neither touches what scheduling
                    # reads: a priority would reorder the claims of a cluster that is behind.
                    data={"description": f"race {start:.3f} #{which}", "version": version},
                )
                statuses.append(response.status_code)
            except Unavailable:
                statuses.append(503)
            finally:
                connection.close()

        threads = [threading.Thread(target=edit, args=(i,)) for i in (1, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        if 503 in statuses:
            pass  # one edit found the database down: nothing to judge
        elif sorted(statuses) != [200, 409]:
            self._anomaly(
                API_CONCURRENT_EDIT,
                f"job {job_id}: two edits of version {version} answered {sorted(statuses)} "
                "(expected one 200 and one 409)",
            )
        self._record(API_CONCURRENT_EDIT, job_id, start, f"answers {sorted(statuses)}")

    def _record(self, kind: str, job_id: int, start: float, detail: str = "") -> None:
        self.faults.append(Fault(kind, f"job {job_id}", start, time.time(), detail=detail))
