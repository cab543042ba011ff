"""The main job, shortened: it trains (the loss goes down), checkpoints, resumes exactly,
and its command line runs end to end."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import accy
from accy.__main__ import main as accy_main
from accy.demo.common import Checkpoint
from accy.demo.train import load_checkpoint, main, save_checkpoint, train


def small_checkpoint(step: int, losses: list[float], size: int = 2) -> Checkpoint:
    """A checkpoint of one parameter `w` and the state of `accy.optim.adam` for it."""
    params = {"w": accy.named(np.full(size, float(step), np.float32), ("a",))}
    return Checkpoint(step, losses, params, accy.optim.adam(0.1).init(params))


@pytest.mark.slow
def test_training_lowers_the_loss(tmp_path):
    state, token_accuracy, _, _ = train(60, 0, "reference", tmp_path, False, quiet=True)
    assert state.step == 60
    assert np.mean(state.losses[-10:]) < 0.5 * np.mean(state.losses[:5])
    assert 0.0 <= token_accuracy <= 1.0


@pytest.mark.slow
def test_a_resumed_run_reaches_the_same_state_as_an_uninterrupted_one(tmp_path):
    straight, *_ = train(16, 3, "reference", tmp_path / "straight", False, quiet=True)
    train(8, 3, "reference", tmp_path / "resumed", False, quiet=True)
    resumed, *_ = train(16, 3, "reference", tmp_path / "resumed", True, quiet=True)
    assert resumed.step == straight.step == 16
    assert resumed.losses == straight.losses
    for a, b in zip(resumed.parameters, straight.parameters, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(resumed.optimizer_state, straight.optimizer_state, strict=True):
        np.testing.assert_array_equal(a, b)


def test_checkpoints_are_written_atomically(tmp_path, monkeypatch):
    import safetensors

    path = tmp_path / "checkpoint.safetensors"
    save_checkpoint(path, small_checkpoint(1, [1.0]))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors, "serialize_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, small_checkpoint(2, [1.0, 0.5]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.safetensors"]
    back = load_checkpoint(path, small_checkpoint(0, []))  # the previous checkpoint is intact
    assert back.step == 1 and back.params["w"].array.tolist() == [1.0, 1.0]


def test_a_corrupt_checkpoint_is_a_clear_error(tmp_path):
    path = tmp_path / "checkpoint.safetensors"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(accy.AccyError, match="cannot resume"):
        load_checkpoint(path, small_checkpoint(0, []))


def test_a_checkpoint_keeps_the_whole_optimizer_state(tmp_path):
    path = tmp_path / "checkpoint.safetensors"
    like = small_checkpoint(0, [])
    opt = accy.optim.adam(0.1)
    grads = {"w": accy.named(np.array([1.0, -2.0], np.float32), ("a",))}
    _, state = opt.update(grads, like.opt_state, like.params)
    save_checkpoint(path, Checkpoint(1, [0.25], like.params, state))
    back = load_checkpoint(path, like)
    assert type(back.opt_state) is type(state) and back.losses == [0.25]
    for a, b in zip(
        accy.optim.base.tree_leaves(back.opt_state), accy.optim.base.tree_leaves(state), strict=True
    ):
        np.testing.assert_array_equal(
            np.asarray(getattr(a, "array", a)), np.asarray(getattr(b, "array", b))
        )


def test_a_checkpoint_of_another_model_is_a_clear_error(tmp_path):
    path = tmp_path / "checkpoint.safetensors"
    save_checkpoint(path, small_checkpoint(1, [1.0], size=3))
    with pytest.raises(accy.AccyError, match="does not fit this model") as raised:
        load_checkpoint(path, small_checkpoint(0, []))
    assert "extents {'a': 3}" in str(raised.value) and "delete it to start over" in str(
        raised.value
    )


@pytest.mark.slow
def test_the_command_line_trains_reports_and_plots(tmp_path, capsys):
    assert main(["--steps", "5", "--device", "reference", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "held-out accuracy" in printed
    assert (tmp_path / "loss.png").stat().st_size > 0
    assert (tmp_path / "checkpoint.safetensors").exists()


@pytest.mark.parametrize("keep", [0.0, 0.5, 0.99], ids=["empty", "half", "nearly_whole"])
def test_resuming_from_a_truncated_checkpoint_says_how_to_start_over(tmp_path, keep):
    path = tmp_path / "checkpoint.safetensors"
    save_checkpoint(path, small_checkpoint(3, [1.0, 1.0, 1.0], size=64))
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(accy.AccyError, match="damaged") as raised:
        load_checkpoint(path, small_checkpoint(0, [], size=64))
    assert str(path) in str(raised.value) and "without --resume" in str(raised.value)


def test_the_command_line_reports_a_damaged_checkpoint_without_a_traceback(tmp_path, capsys):
    (tmp_path / "checkpoint.safetensors").write_bytes(b"")
    arguments = ["demo", "--resume", "--steps", "1", "--device", "reference", "--out"]
    assert accy_main([*arguments, str(tmp_path)]) == 1
    error = capsys.readouterr().err
    assert str(tmp_path / "checkpoint.safetensors") in error and "delete it" in error


@pytest.mark.parametrize("missing", ["tqdm", "matplotlib"])
def test_the_demo_without_its_extra_says_which_to_install(tmp_path, capsys, monkeypatch, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # `import missing` now fails
    arguments = ["demo", "--steps", "1", "--device", "reference", "--out", str(tmp_path)]
    assert accy_main(arguments) == 1
    error = capsys.readouterr().err
    assert missing in error and "pip install 'accy[demo]'" in error
    assert not (tmp_path / "checkpoint.safetensors").exists()  # refused before any training


@pytest.mark.slow
def test_scan_layers_gives_the_loss_and_gradients_of_the_unrolled_model():
    # The layers stacked along `layer` and run as one scan: the same model, so the same loss
    # and (restacked) the same gradients, traced (a scan in the program) and eager (a loop).
    from dataclasses import replace

    from accy.demo.data import SortingTask
    from accy.demo.model import Config, initial_parameters, loss, parameter_specs, stack_layers

    task = SortingTask()
    unrolled = Config(vocab=12, tokens=task.tokens, layers=3, batch=4)
    scanned = replace(unrolled, scan_layers=True)
    ids, targets, weights = task.batch(np.random.default_rng(1), unrolled.batch)
    batch = [accy.named(a, ("batch", "token")) for a in (ids, targets, weights)]
    results = {}
    for config in (unrolled, scanned):
        specs = parameter_specs(config)
        values = initial_parameters(config, np.random.default_rng(0))
        params = {k: accy.named(v, specs[k].axes) for k, v in values.items()}

        def step(p, ids, targets, weights, config=config):
            return accy.value_and_grad(lambda p: loss(p, ids, targets, weights, config))(p)

        value, grads = accy.jit(step)(params, *batch)
        eager = loss(params, *batch, config)
        results[config.scan_layers] = (float(value), float(eager), grads)
    (u_value, u_eager, u_grads), (s_value, s_eager, s_grads) = results[False], results[True]
    assert abs(u_value - s_value) <= 1e-6 * abs(u_value)
    assert abs(u_eager - s_eager) <= 1e-6 * abs(u_eager) and abs(u_value - u_eager) < 1e-5
    restacked = stack_layers({k: np.asarray(g.array) for k, g in u_grads.items()}, unrolled)
    for name, gradient in s_grads.items():
        np.testing.assert_allclose(
            np.asarray(gradient.array), restacked[name], rtol=1e-4, atol=1e-6, err_msg=name
        )


@pytest.mark.slow
def test_scan_layers_trains_and_refuses_an_unstacked_checkpoint(tmp_path):
    state, *_ = train(6, 0, "reference", tmp_path, False, quiet=True, scan_layers=True)
    assert state.step == 6 and state.parameters[2].shape[0] == 2  # stacked along `layer`
    unstacked = tmp_path / "unstacked"
    train(2, 0, "reference", unstacked, False, quiet=True)
    with pytest.raises(accy.AccyError, match="written with --scan-layers resumes only with it"):
        train(4, 0, "reference", unstacked, True, quiet=True, scan_layers=True)


def test_the_scanned_model_does_not_grow_with_depth():
    from dataclasses import replace

    from accy.demo.data import SortingTask
    from accy.demo.model import Config, initial_parameters, loss, parameter_specs
    from accy.frontend.tracing import flatten, trace

    task = SortingTask()

    def operations(layers: int, scan_layers: bool) -> int:
        config = Config(vocab=12, tokens=task.tokens, layers=layers, batch=2)
        config = replace(config, scan_layers=scan_layers)
        specs = parameter_specs(config)
        values = initial_parameters(config, np.random.default_rng(0))
        params = {k: accy.named(v, specs[k].axes) for k, v in values.items()}
        batch = [accy.named(a, ("batch", "token")) for a in task.batch(np.random.default_rng(0), 2)]
        leaves, treedef = flatten(((params, *batch), {}))
        program = trace(lambda p, *b: loss(p, *b, config), leaves, treedef).program
        assert program.count("scan") == (1 if scan_layers else 0)
        return len(program.operations)

    assert operations(2, True) == operations(8, True)
    assert operations(8, False) > 3 * operations(2, False) // 2
