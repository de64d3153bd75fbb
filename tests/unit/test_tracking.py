"""Tracking's parts without a job: the spec section, the fan-out's rules (no step twice, a failing tracker is
a warning), MLflow's parameter limit on a real file store, an unreachable server, W&B's offline files read
back after a cut, and the preflight for a missing package. The whole path, SIGKILL and resume included, is
tests/integration/test_tracking.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from entrypoint.job import layout
from entrypoint.store.file import FileStore
from entrypoint.tracking import RunRef, Tracking, open_tracking, spec_params
from entrypoint.training import device
from entrypoint.training.device import Unsupported, preflight
from jobspec.schema import Tracking as TrackingSpec
from jobspec.schema import Training


@pytest.mark.parametrize(
    ("section", "field", "where"),
    [
        ({"wandb": {"project": "p", "api_key": "abc"}}, "api_key", "WANDB_API_KEY"),
        ({"mlflow": {"token": "abc"}}, "token", "MLFLOW_TRACKING_TOKEN"),
        (
            {"mlflow": {"tracking_uri": "https://me:secret@mlflow.example.com"}},
            "tracking_uri",
            "MLFLOW_TRACKING_PASSWORD",
        ),
    ],
)
def test_credentials_in_the_spec_are_refused_with_where_they_belong(section, field, where):
    with pytest.raises(ValidationError) as error:
        TrackingSpec(**section)
    message = str(error.value)
    assert field in message and where in message and ("credentials" in message or "user:password" in message)


def test_a_tracking_section_without_credentials_validates():
    spec = TrackingSpec(tensorboard=True, mlflow={"tracking_uri": "https://mlflow.example.com"}, wandb={"project": "p"})
    assert spec.enabled == ["tensorboard", "mlflow", "wandb"]
    assert TrackingSpec().enabled == []


class _Fake:
    def __init__(self, name: str, held: dict | None = None, fail_on: str | None = None):
        self.name, self.held, self.fail_on = name, held or {}, fail_on
        self.logged: list[tuple[int, dict]] = []
        self.params: dict = {}

    def logged_steps(self, keys):
        return {k: v for k, v in self.held.items() if k in keys}

    def log_metrics(self, metrics, step):
        if self.fail_on == "metrics":
            raise ConnectionError("server went away")
        self.logged.append((step, metrics))

    def log_params(self, params):
        self.params.update(params)

    def log_files(self, files):
        pass

    def close(self, finished):
        pass


def test_no_tracker_gets_a_step_it_already_holds_and_each_metric_counts_on_its_own():
    ahead, behind = _Fake("ahead", held={"train/loss": 5, "eval/loss": 4}), _Fake("behind")
    lines = []
    tracking = Tracking([ahead, behind], {}, lines.append)
    tracking.read_held_steps(["train/loss", "eval/loss"])
    for step in range(1, 7):
        tracking.metrics({"train/loss": 1.0 / step}, step)
        if step % 2 == 0:
            tracking.metrics({"eval/loss": 2.0 / step, "train/loss": 9.9}, step)  # eval at a step already logged
    assert [s for s, _ in ahead.logged] == [6, 6]
    assert ahead.logged[1][1] == {"eval/loss": 2.0 / 6}  # the same step's train loss is not sent again
    assert [s for s, m in behind.logged if "train/loss" in m] == [1, 2, 3, 4, 5, 6]
    assert [s for s, m in behind.logged if "eval/loss" in m] == [2, 4, 6]
    assert not lines


def test_a_failing_tracker_is_a_warning_and_the_others_go_on():
    broken, fine = _Fake("broken", fail_on="metrics"), _Fake("fine")
    lines = []
    tracking = Tracking([broken, fine], {}, lines.append)
    tracking.metrics({"train/loss": 1.0}, 1)
    tracking.metrics({"train/loss": 0.5}, 2)
    assert [s for s, _ in fine.logged] == [1, 2]
    assert len(lines) == 1 and "warning: broken" in lines[0] and "server went away" in lines[0]
    assert [t.name for t in tracking.trackers] == ["fine"]


def test_only_runs_started_by_this_process_are_described():
    new, continued = _Fake("new"), _Fake("continued")
    Tracking([new, continued], {}, print, new=frozenset({"new"})).describe_new_runs({"a": "1"}, [])
    assert new.params == {"a": "1"} and continued.params == {}


def test_spec_params_are_flat_strings():
    params = spec_params({"training": {"learning_rate": 0.0002, "checkpoint": {"keep": 3}}, "tags": ["a"], "x": None})
    assert params == {"training.learning_rate": "0.0002", "training.checkpoint.keep": "3", "tags": '["a"]', "x": "null"}


def _run(tmp_path: Path, trial: str = "main") -> RunRef:
    return RunRef("job", trial, FileStore(tmp_path / "store"), tmp_path / "scratch", "train")


def test_mlflow_parameters_longer_than_the_old_servers_limit_are_cut_not_fatal(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow import MlflowClient

    from entrypoint.tracking.mlflow_runs import PARAM_LIMIT

    uri = (tmp_path / "mlruns").as_uri()
    tracking = open_tracking(TrackingSpec(mlflow={"tracking_uri": uri}), _run(tmp_path), print)
    tracking.describe_new_runs({"hypothesis.statement": "x" * 2000, "short": "y"}, [])
    tracking.close(finished=True)
    run = MlflowClient(uri).get_run(tracking.ids["mlflow"]["run_id"])
    assert len(run.data.params["hypothesis.statement"]) == PARAM_LIMIT and run.data.params["short"] == "y"
    assert run.info.status == "FINISHED"


def test_an_unreachable_tracker_is_a_warning_and_the_ids_of_the_others_are_stored(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    lines = []
    spec = TrackingSpec(tensorboard=True, mlflow={"tracking_uri": "http://127.0.0.1:9"})  # port 9: nothing listens
    run = _run(tmp_path)
    tracking = open_tracking(spec, run, lines.append)
    assert [t.name for t in tracking.trackers] == ["tensorboard"]
    assert any("warning: mlflow" in line and "goes on without it" in line for line in lines)
    tracking.metrics({"train/loss": 1.0}, 1)
    tracking.close(finished=True)
    stored = run.store.get_bytes(layout.trial_tracking("main"))
    assert b"tensorboard" in stored and b"mlflow" not in stored
    assert [info.key for info in run.store.list("trials/main/tensorboard")]  # the event file reached the store


_OFFLINE_RUN = """
import sys, wandb
run = wandb.init(project="p", id="cut0001", mode="offline", dir=sys.argv[1], settings=wandb.Settings(console="off"))
for step in range(1, 301):
    run.log({"train/loss": 1.0 / step, "train/learning_rate": 0.1}, step=step)
run.finish()
"""


def test_wandb_offline_steps_are_read_back_and_a_cut_file_gives_what_reached_the_disk(tmp_path):
    from entrypoint.tracking.wandb_runs import offline_steps

    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_API_KEY": ""}
    subprocess.run([sys.executable, "-c", _OFFLINE_RUN, str(tmp_path)], env=env, check=True, timeout=120)
    folder = tmp_path / "wandb"
    assert offline_steps(folder, "cut0001") == {"train/loss": 300, "train/learning_rate": 300}
    [path] = folder.glob("offline-run-*-cut0001/run-cut0001.wandb")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 + 3])  # a kill mid-record
    held = offline_steps(folder, "cut0001")
    assert 50 < held["train/loss"] < 300
    assert offline_steps(folder, "another") == {}


def test_preflight_refuses_a_tracker_whose_package_is_missing(monkeypatch):
    monkeypatch.setitem(device.TRACKING_MODULES, "wandb", "no_such_module_for_rentune")
    with pytest.raises(Unsupported, match="tracking: wandb enabled but this image lacks no_such_module_for_rentune"):
        preflight(Training(device="cpu"), tracking=TrackingSpec(wandb={"project": "p"}))
    assert preflight(Training(device="cpu"), tracking=TrackingSpec(tensorboard=True)).type == "cpu"


def test_an_unreadable_tracking_record_is_a_warning_and_new_runs_start(tmp_path):
    run = _run(tmp_path)
    run.store.put_bytes(layout.trial_tracking("main"), b'{"tensorboard": {"prefix": "trials/ma')  # cut short
    lines = []
    tracking = open_tracking(TrackingSpec(tensorboard=True), run, lines.append)
    assert [t.name for t in tracking.trackers] == ["tensorboard"] and tracking.new == {"tensorboard"}
    assert any(line.startswith("tracking: warning:") and "tracking.json" in line for line in lines)
    tracking.close(finished=True)
    assert b'"prefix": "trials/main/tensorboard"' in run.store.get_bytes(
        layout.trial_tracking("main")
    )  # rewritten whole


def test_mlflow_takes_names_it_would_refuse_and_a_failed_send_surfaces_at_the_next_step(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    lines = []
    tracking = open_tracking(TrackingSpec(mlflow={"tracking_uri": uri}), _run(tmp_path), lines.append)
    [mlflow] = tracking.trackers
    tracking.describe_new_runs({"hypothesis.fields.R&D (eu)": "x"}, [])
    tracking.metrics({"eval/required_present_rate@billing": 0.5, "eval/f1/R&D (eu)": 0.25}, 3)
    tracking.close(finished=True)
    run = MlflowClient(uri).get_run(tracking.ids["mlflow"]["run_id"])
    assert run.data.metrics == {"eval/required_present_rate_billing": 0.5, "eval/f1/R_D _eu_": 0.25}
    assert run.data.params == {"hypothesis.fields.R_D _eu_": "x"} and run.info.status == "FINISHED"
    assert not [line for line in lines if "warning" in line]

    # A send that fails (the run is gone from the server) stops the sender; the next step raises it.
    tracking = open_tracking(TrackingSpec(mlflow={"tracking_uri": uri}), _run(tmp_path, "other"), lines.append)
    [mlflow] = tracking.trackers
    mlflow.run_id = "0" * 32
    mlflow.log_metrics({"train/loss": 1.0}, 1)
    mlflow.queue.put(None)  # the sender stops once it has tried
    mlflow.sender.join(timeout=60)
    with pytest.raises(Exception, match="0" * 32):
        mlflow.log_metrics({"train/loss": 0.5}, 2)


class _FakeRun:
    def __init__(self, step: int):
        self.step, self.logged, self.summary = step, [], {}

    def log(self, metrics, step):
        self.logged.append((step, metrics))


def test_wandb_results_below_a_continued_online_runs_step_go_to_its_summary():
    from entrypoint.tracking.wandb_runs import WandbRuns

    runs = WandbRuns(TrackingSpec(wandb={"project": "p"}).wandb)
    runs.run = _FakeRun(step=121)  # the server's last step + 1
    runs.log_metrics({"eval/accuracy": 0.9}, 120)
    runs.log_metrics({"train/loss": 0.1}, 121)
    assert runs.run.summary == {"eval/accuracy": 0.9} and runs.run.logged == [(121, {"train/loss": 0.1})]


class _FlakyStore(FileStore):
    def __init__(self, root: Path, failures: int):
        super().__init__(root)
        self.failures = failures

    def put_file(self, key, path):
        if self.failures:
            self.failures -= 1
            raise ConnectionError("503 Slow Down")
        return super().put_file(key, path)


def test_a_failed_copy_of_tensorboard_files_is_retried_and_too_many_in_a_row_drop_it(tmp_path):
    from entrypoint.tracking.tensorboard_files import FAILED_COPIES

    store = _FlakyStore(tmp_path / "store", failures=1)
    run = RunRef("job", "main", store, tmp_path / "scratch", "train")
    lines = []
    tracking = open_tracking(TrackingSpec(tensorboard=True), run, lines.append)
    [board] = tracking.trackers
    tracking.metrics({"train/loss": 1.0}, 1)
    tracking.sync()
    board._upload.join()
    assert board.failures == 1 and not list(store.list("trials/main/tensorboard"))
    tracking.sync()  # the retry
    board._upload.join()
    assert board.failures == 0 and list(store.list("trials/main/tensorboard"))
    store.failures = FAILED_COPIES
    for _ in range(FAILED_COPIES + 1):
        tracking.sync()
        if board._upload is not None:
            board._upload.join()
    assert not tracking.trackers and any("copies of the event files" in line for line in lines)
