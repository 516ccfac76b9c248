"""Tables of runs, shared by compare and the sweep report: a cell of each kind of value (sizes,
durations, rates, metrics to 4 digits, a NaN as nan, a seed group's Spread as 'mean ± std'), the
columns worth showing, a seed group's row, and the Markdown table."""

import dataclasses
import json
import math
import os
import statistics
from typing import Any, Mapping, Sequence

# Metrics that count what an evaluation covered: bookkeeping, not results.
COUNT_METRICS = ("decoded_examples", "scored_tokens", "split_examples", "split_tokens")
# Columns of numbers shown in a unit of their own (others: 4 digits).
SIZES = ("params", "tokens")
UNIT_COLUMNS = (*SIZES, "wall_seconds", "tokens_per_sec")


@dataclasses.dataclass(frozen=True)
class Spread:
  """A number over the runs of a seed group: mean, sample standard deviation, min, max, n."""
  mean: float
  std: float
  min: float
  max: float
  n: int

  @classmethod
  def of(cls, values: Sequence[float]) -> "Spread":
    """The spread of `values` (std 0 for a single value); a NaN or an infinity among them is
    the mean (NaN, or that infinity), never averaged away, and the std is then NaN."""
    if not all(math.isfinite(v) for v in values):
      mean = math.fsum(values)  # NaN if any is, +-inf if an infinity is, NaN if both signs
      return cls(mean, math.nan, min(values), max(values), len(values))
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return cls(statistics.fmean(values), std, min(values), max(values), len(values))


def is_number(value: Any) -> bool:
  """Whether `value` is an int or a float (not a bool)."""
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def same(values: Sequence[Any]) -> bool:
  """Whether `values` are all equal (compared as JSON text: a list equals its tuple)."""
  return len({json.dumps(v, sort_keys=True, default=str) for v in values}) <= 1


def is_result(column: str) -> bool:
  """A metric column (dev/wer, test/loss, best dev/loss, ...), not a count of what it covered."""
  return "/" in column and column.rsplit("/", 1)[1] not in COUNT_METRICS


def group_label(names: Sequence[str]) -> str:
  """runs/s/a, runs/s/b -> runs/s/{a,b}; names without one parent joined by ' + '."""
  if len(names) == 1:
    return names[0]
  parents = {os.path.dirname(n) for n in names}
  if len(parents) == 1:
    return os.path.join(parents.pop(), "{" + ",".join(os.path.basename(n) for n in names) + "}")
  return " + ".join(names)


def group_row(rows: Sequence[Mapping[str, Any]], keys: Sequence[str], name: str = "run"
              ) -> dict[str, Any]:
  """One row for the `rows` of a seed group: its label (column `name`), n, each of the config
  `keys` (the values, comma-joined, where they differ: the seeds) and each number as a Spread."""
  out: dict[str, Any] = {name: group_label([str(r.get(name, "")) for r in rows]), "n": len(rows)}
  for column in dict.fromkeys(k for r in rows for k in r):
    if column == name:
      continue
    values = [r[column] for r in rows if r.get(column) is not None]
    if column not in keys and values and all(is_number(v) for v in values):
      out[column] = Spread.of(values)
    elif same(values):
      out[column] = values[0] if values else None
    else:
      out[column] = ",".join(str(v) for v in dict.fromkeys(values))
  return out


def shown_columns(rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
                  keep: Sequence[str] = ()) -> list[str]:
  """`columns` less those whose cells are the same in every row (of two or more), except `keep`
  and results (is_result): a result the runs share is still their result."""
  if len(rows) < 2:
    return list(columns)
  return [c for c in columns if c in keep or is_result(c)
          or len({format_cell(c, r.get(c)) for r in rows}) > 1]


def _number(key: str, x: float, like: float | None = None) -> str:
  """A number of column `key` in the unit its size (or `like`'s) calls for: M tokens or
  parameters, minutes or seconds, thousands separated rates, else 4 digits."""
  size = x if like is None else like
  if key in SIZES:
    return f"{x / 1e6:.2f}M" if size >= 1e5 else f"{x:,.0f}"
  if key == "wall_seconds":
    return f"{x / 60:.1f} min" if size >= 120 else f"{x:.0f} s"
  if key == "tokens_per_sec":
    return f"{x:,.0f}"
  return str(x) if isinstance(x, int) else f"{x:.4g}"


def format_cell(key: str, value: Any) -> str:
  """A value as a table cell: sizes and durations readable, metrics to 4 digits, config values
  as written, a Spread as 'mean ± std' ('mean' alone when its values are equal)."""
  if isinstance(value, Spread):
    mean = int(value.mean) if value.mean.is_integer() else value.mean
    if value.n < 2 or value.std == 0 or math.isnan(value.std):
      return _number(key, mean)
    return f"{_number(key, mean)} ± {_number(key, value.std, like=value.mean)}"
  if value is None or value == "":
    return ""
  if is_number(value) and (key in UNIT_COLUMNS or isinstance(value, float) and "/" in key):
    return _number(key, value)
  if isinstance(value, (list, dict)):
    return json.dumps(value)
  return (repr(value) if isinstance(value, float) else str(value)).replace("|", "\\|")


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
                   bold: tuple[str, Any] | None = None) -> str:
  """A Markdown table of `rows` in `columns`; bold=(column, value): that cell in bold."""
  lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
  for row in rows:
    cells = [format_cell(k, row.get(k)) for k in columns]
    if bold is not None and bold[0] in columns and row.get(bold[0]) == bold[1]:
      i = columns.index(bold[0])
      cells[i] = f"**{cells[i]}**"
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"
