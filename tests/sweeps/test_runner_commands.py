"""Sweeps printed: the exact dry-run and TPU VM commands, the README's lines, the is_done guard."""

import os
import re
import shlex
import textwrap

from sweep_fixtures import ROOT, TINY, sweep_cli, write_sweep, fake  # noqa: F401  (fake: a pytest fixture)
from transformer.sweeps import runner


def test_dry_run_prints_the_exact_commands(tmp_path):
  """--dry_run prints, per point, a status comment and the exact train/eval argv (sweep-wide
  --config.* overrides first, then the point's), then how many runs and training steps it would
  start, and runs nothing."""
  path = write_sweep(tmp_path, 'def get_sweep():\n  return sweep("model.positional", '
                     '["sinusoidal", "rope"])\n')
  w = tmp_path / "w"
  out = sweep_cli(f"--config={TINY}", f"--sweep={path}", f"--workdir={w}", "--python=python3",
                  "--config.train.num_steps=4", "--dry_run")
  assert out.returncode == 0, out.stderr
  assert out.stdout == textwrap.dedent(f"""\
      # positional=sinusoidal: new
      python3 train.py --config={TINY} --workdir={w}/positional=sinusoidal --config.train.num_steps=4 --config.model.positional=sinusoidal
      python3 eval.py --workdir={w}/positional=sinusoidal --split=test
      # positional=rope: new
      python3 train.py --config={TINY} --workdir={w}/positional=rope --config.train.num_steps=4 --config.model.positional=rope
      python3 eval.py --workdir={w}/positional=rope --split=test
      # 2 points: 2 training runs to start (8 training steps in all), 2 evaluations, 0 points done
      """)
  assert not w.exists()


def test_tpu_vm_commands_are_exact_and_never_executed(tmp_path):
  """--launcher=tpu_vm prints one gcloud ssh per point (all workers; workdir and data_dir on the
  bucket; train then eval, both skipped when `sweep_runner is_done` says the point is done), then
  as the last line the exact command that collects the results (without checkpoints) and reports;
  missing TPU flags are a one-line error."""
  path = write_sweep(tmp_path, 'def get_sweep():\n  return sweep("train.learning_rate", [0.5, 2.0])\n')
  out = sweep_cli("--config=configs/g2p.py:small", f"--sweep={path}", "--workdir=runs/sw",
                  "--launcher=tpu_vm", "--tpu_name=my-tpu", "--zone=us-central2-b",
                  "--bucket=gs://bkt/", "--eval_split=test")
  assert out.returncode == 0, out.stderr
  expected = []
  for lr in ("0.5", "2.0"):
    w = f"gs://bkt/runs/sw/lr={lr}"
    expected += [f"# lr={lr}", (
        "gcloud compute tpus tpu-vm ssh my-tpu --zone=us-central2-b --worker=all "
        f'--command="cd ~/transformer && if ! python3 -m transformer.sweeps.runner is_done {w} '
        "--num_steps=20000 --split=test; then python3 train.py --config=configs/g2p.py:small "
        f"--workdir={w} --config.train.learning_rate={lr} "
        "--config.data.data_dir=gs://bkt/tensorflow_datasets && python3 eval.py "
        f'--workdir={w} --split=test; fi"')]
  expected += ["# then copy the results back (without checkpoints) and write the report:",
               "gcloud storage rsync -r -x '.*/checkpoints/.*' gs://bkt/runs/sw runs/sw && "
               f"python sweep.py --config=configs/g2p.py:small --sweep={path} --workdir=runs/sw "
               "--eval_split=test --report_only"]
  assert out.stdout.splitlines() == expected
  bad = sweep_cli("--config=configs/g2p.py:small", f"--sweep={path}", "--workdir=runs/sw",
                  "--launcher=tpu_vm", "--tpu_name=my-tpu")
  assert bad.returncode == 1 and bad.stderr == "error: --launcher=tpu_vm needs --zone, --bucket\n"


def _docs_block_after(marker: str) -> str:
  """The first fenced block after `marker` in docs/sweeps.md, `\\`-continued lines joined."""
  with open(os.path.join(ROOT, "docs", "sweeps.md")) as f:
    text = f.read()
  block = text[text.index(marker):].split("```", 2)[1]
  return re.sub(r"\\\n\s*", "", block.split("\n", 1)[1]).strip()


def test_documented_tpu_sweep_lines_are_what_sweep_py_prints():
  """docs/sweeps.md's "Sweeps on cloud TPUs": its command prints, for the point positional=rope,
  exactly the ssh line the page shows, and its last line is exactly the collect command shown there."""
  command = _docs_block_after("run them one after the other from your machine")
  args = shlex.split(command.replace(" [--execute]", ""))
  assert args[:2] == ["python", "sweep.py"]
  out = sweep_cli(*args[2:])
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  shown = _docs_block_after("which prints, for each point,").splitlines()
  assert lines[lines.index(shown[0]) + 1] == shown[1]
  collect = _docs_block_after("the last line `sweep.py` printed is exactly this command")
  assert lines[-1] == collect


def test_is_done_is_the_local_runners_test(fake, capsys):
  """`python -m transformer.sweeps.runner is_done` (the TPU commands' guard) exits 0 exactly when
  the local runner would skip the point: trained to num_steps and, with --split, evaluated at
  that step; otherwise 1 with the point's status."""
  points, commands = fake
  p = points[0]
  args = ["is_done", p.workdir, f"--num_steps={p.num_steps}", "--split=test"]
  assert runner.main(args) == 1 and capsys.readouterr().out == f"{p.workdir}: new\n"
  assert runner.run(points[:1], commands, echo=lambda _: None) == []
  assert runner.status(p, commands) == "done"
  assert runner.main(args) == 0
  assert capsys.readouterr().out == f"{p.workdir}: done (skipped)\n"
  assert runner.main(args[:2] + [f"--num_steps={p.num_steps + 1}"]) == 1  # train further
  os.remove(os.path.join(p.workdir, "metrics.test.json"))
  assert runner.main(args) == 1 and capsys.readouterr().out.endswith(": eval\n")
  assert runner.main(args[:3]) == 0  # no eval split: trained is done


def test_sweep_settings_no_point_can_meet_are_refused_before_anything_runs(tmp_path):
  """An ASHA metric a point's in-training evaluations never log (a typo, a decoded metric of an
  MoE-less run's moe_*), ASHA maximizing a loss, a reduction factor <= 1, W&B online without an
  API key (what train.py refuses at its start), --parallel=0, a NaN resource, a --metric no
  report row can hold, a --workdir that is a file: one line each, exit 1, nothing written."""
  path = write_sweep(tmp_path, 'def get_sweep():\n  return sweep("model.ffn", ["relu", "moe"])\n')
  w = tmp_path / "w"
  cases = {("--early_stop=asha", "--asha_metric=eval/wr"): "--asha_metric='eval/wr' is not a "
           "metric this config's in-training evaluations log; they log eval/loss, eval/accuracy",
           ("--early_stop=asha", "--asha_metric=eval/moe_dropped"): "(point ffn=relu)",
           ("--early_stop=asha", "--asha_reduction_factor=1"): "--asha_reduction_factor=1.0 "
           "must be > 1",
           ("--early_stop=asha", "--asha_mode=max"): "--asha_mode=max for --asha_metric="
           "'eval/loss': lower is better; give --asha_mode=min",
           ("--config.train.wandb_project=p",): "train.wandb_project='p' logs online but W&B has "
           "no API key",
           ("--parallel=0",): "--parallel=0: 0 is not a positive integer",
           ("--python=/nonexistent/python",): "--python=/nonexistent/python: no such executable",
           ("--metric=eval/wer",): "--metric=eval/wer: the report's metrics are dev/<name>",
           ("--metric=dev/wr",): "--metric='dev/wr' is not a metric",
           ("--launcher=ray", "--ray_num_gpus=nan"): "--ray_num_gpus=nan: must be a finite number"}
  for flags, expected in cases.items():
    out = sweep_cli(f"--config={TINY}", f"--sweep={path}", f"--workdir={w}", *flags,
                    env={"WANDB_API_KEY": "", "WANDB_MODE": "", "NETRC": str(tmp_path / "none")})
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 1 and last.startswith("error: ") and expected in last, out.stderr
    assert "Traceback" not in out.stderr and not w.exists()
  out = sweep_cli(f"--config={TINY}", f"--sweep={path}", f"--workdir={w}", "--dry_run",
                  "--early_stop=asha", "--asha_metric=dev/wer")
  assert out.returncode == 0, out.stderr
  out = sweep_cli(f"--config={TINY}", f"--sweep={path}", "--workdir=", "--dry_run")
  assert out.returncode == 1 and out.stderr.strip().splitlines()[-1] == (
      "error: --workdir='' is empty: name a directory for the sweep's points")
  w.write_text("a file")
  out = sweep_cli(f"--config={TINY}", f"--sweep={path}", f"--workdir={w}", "--report_only")
  assert out.returncode == 1 and out.stderr.strip().splitlines()[-1] == (
      f"error: --workdir={w} is a file, not a directory: name a directory for the sweep's points")
  assert w.read_text() == "a file"
