"""scaling.json's fits as text: Approach 2 and Approach 3 side by side, then each prediction and,
for a held-out budget, what its runs reached."""

from typing import Any, Mapping


def _value(fit: Mapping[str, Any], name: str, digits: int = 3) -> str:
  """'0.352 [0.31, 0.40]': a fitted number and its bootstrap interval; '-' if not fitted."""
  if name not in fit:
    return "-"
  low_high = fit.get("intervals", {}).get(name)
  text = f"{fit[name]:.{digits}g}"
  return text + (f" [{low_high[0]:.{digits}g}, {low_high[1]:.{digits}g}]" if low_high else "")


def _row(label: str, left: str, right: str, note: str = "") -> str:
  return f"  {label:<24} {left:<28} {right:<28} {note}".rstrip()


def _prediction(name: str, result: Mapping[str, Any]) -> list[str]:
  a2, a3 = (result[a]["predictions"][name] for a in ("approach2", "approach3"))
  held = result["held_out"].get(name)
  seen = held["observed"] if held else {}
  lines = [f"at {name} FLOPs" + (" (held out):" if held else ":")]
  vertex = seen.get("vertex_params")
  notes = {"n_opt": (f"observed: vertex {vertex:.3g}, lowest loss at {seen['best_loss_params']:.3g}"
                     if held and vertex else ""),
           "loss": f"observed: {seen['best_loss']:.4f}" if held else ""}
  for k, label in (("n_opt", "N* (parameters)"), ("d_opt", "D* (tokens)"), ("loss", "L*")):
    digits = 4 if k == "loss" else 3
    lines.append(_row(label, _value(a2, k, digits), _value(a3, k, digits), notes.get(k, "")))
  if held:
    for a in ("approach2", "approach3"):
      c = held[a]
      lines.append(f"  {a}: loss {100 * c['loss_error']:+.2f}% (goal within 2%), size x"
                   f"{c['size_ratio']:.2f} (goal within 1.5x)")
  return lines


def text(result: Mapping[str, Any]) -> str:
  """The fits side by side and the predictions (what `python -m transformer.scaling fit`
  prints)."""
  a2, a3 = result["approach2"], result["approach3"]
  fitted = ", ".join(f"{b:.3g}" for b in result["fitted_budgets"])
  lines = [f"{len(result['runs'])} runs ({result['metric']}); fitted budgets: {fitted} FLOPs"]
  lines += [f"left out: {why}" for why in result["left_out"]]
  f = result["flops_per_token"]
  lines += [f"FLOPs per token f(N) = {f['k']:.3g} N^{f['e']:.3f} (fitted to the runs)", "",
            _row("", "Approach 2 (IsoFLOP)", "Approach 3 (L(N, D))"),
            _row("a (N* ~ C^a)", _value(a2, "a"), _value(a3, "a")),
            _row("b (D* ~ C^b)", _value(a2, "b"), _value(a3, "b")),
            _row("gamma (L* ~ C^-gamma)", _value(a2, "gamma"), "-")]
  lines += [_row(k, "-", _value(a3, k)) for k in ("alpha", "beta", "E", "A", "B")]
  lines.append(_row("bootstrap samples", f"{a2['bootstrap']['samples']} ("
                    f"{a2['bootstrap']['failed']} without a vertex)",
                    str(a3["bootstrap"]["samples"])))
  lines += ["", "IsoFLOP vertices (Approach 2):"]
  lines += [f"  {p['budget']:.3g} FLOPs: N* {p['n_opt']:.3g}, L* {p['loss_opt']:.4f} "
            f"({p['runs']} runs)" for p in a2["profiles"]]
  lines += [f"  left out of Approach 2: {why}" for why in a2.get("dropped", [])]
  for name in a2["predictions"]:
    lines += [""] + _prediction(name, result)
  return "\n".join(lines) + "\n"
