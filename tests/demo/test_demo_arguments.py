"""`accy demo` refuses what it cannot run before doing any work: a checkpoint whose step or
losses are not what the demo writes (an AccyError naming the field, through the command line
without a traceback), and a number of steps below 1."""

from __future__ import annotations

import numpy as np
import pytest

import accy
from accy.__main__ import main as accy_main
from accy.demo.common import Checkpoint
from accy.demo.train import load_checkpoint


def fresh() -> Checkpoint:
    """A checkpoint of one parameter `w` and the state of `accy.optim.adam` for it."""
    params = {"w": accy.named(np.ones(2, np.float32), ("a",))}
    return Checkpoint(0, [], params, accy.optim.adam(0.1).init(params))


def write_checkpoint(path, step, losses) -> None:
    """A checkpoint in the demo's layout with the given step and losses, as they are."""
    like = fresh()
    progress = {"step": np.asarray(step), "losses": np.asarray(losses)}
    leaves = accy.optim.base.tree_leaves(like.opt_state)
    accy.save(path, {"progress": progress, "params": like.params, "opt_state": leaves})


@pytest.mark.parametrize(
    ("step", "losses", "message"),
    [
        ([[1, 2], [3, 4]], [1.0] * 4, r"step is a int\d+ array of shape \(2, 2\)"),
        (2.5, [1.0, 2.0], "step is a float64 array of shape ()"),
        (-3, [], "step is -3, not a number of steps taken"),
        (1, 0.5, r"losses are a float64 array of shape \(\)"),
        (2, [0.5], "1 losses for 2 steps"),
    ],
    ids=["2-d step", "fractional step", "negative step", "0-d losses", "losses short"],
)
def test_a_checkpoint_with_a_malformed_step_or_losses_is_refused(tmp_path, step, losses, message):
    path = tmp_path / "checkpoint.safetensors"
    write_checkpoint(path, step, losses)
    with pytest.raises(accy.AccyError, match=message) as raised:
        load_checkpoint(path, fresh())
    assert str(path) in str(raised.value) and "delete it to start over" in str(raised.value)


def test_a_well_formed_checkpoint_is_read_back(tmp_path):
    path = tmp_path / "checkpoint.safetensors"
    write_checkpoint(path, 2, [0.5, 0.25])
    state = load_checkpoint(path, fresh())
    assert state.step == 2 and state.losses == [0.5, 0.25]


def test_a_safetensors_file_of_another_layout_is_refused(tmp_path):
    path = tmp_path / "checkpoint.safetensors"
    accy.save(path, {"params": fresh().params})
    with pytest.raises(accy.AccyError, match="not one this demo wrote"):
        load_checkpoint(path, fresh())


def test_the_command_line_reports_a_malformed_checkpoint_without_a_traceback(tmp_path, capsys):
    write_checkpoint(tmp_path / "checkpoint.safetensors", -1, [])
    arguments = ["demo", "--resume", "--steps", "1", "--device", "reference", "--out"]
    assert accy_main([*arguments, str(tmp_path)]) == 1
    assert "step is -1" in capsys.readouterr().err


@pytest.mark.parametrize("steps", ["0", "-5"])
def test_fewer_than_one_step_is_refused_before_any_work(tmp_path, capsys, steps):
    with pytest.raises(SystemExit) as raised:
        accy_main(["demo", "--steps", steps, "--device", "reference", "--out", str(tmp_path)])
    assert raised.value.code == 2
    assert f"--steps must be at least 1, not {steps}" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing trained, evaluated or written
