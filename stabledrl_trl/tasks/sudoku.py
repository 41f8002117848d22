"""4x4 Sudoku: fill a 4x4 grid with digits 1-4 so that every row, column and 2x2 box holds each digit once.

Puzzles are 16-character strings read row by row, "0" or "." for a blank, digits 1-4 for givens ("1.3.....").
There is no canonical hub set: pass a local CSV/JSON(L) with `puzzle` (and optionally `solution`) columns, or let
`generate_puzzles` build them: deterministic given the seed, each puzzle distinct and with exactly one solution.
The generated "train" and "test" sets are disjoint: a puzzle belongs to "test" when the first byte of the MD5 of its
string is divisible by `TEST_BUCKETS` (8), so about 1 puzzle in 8 is a test puzzle whatever the seed.

Answer: `extract_final_answer` of the completion (last <answer> tag, or last \\boxed{}); whitespace, commas and "|"
are dropped (so "1234 3412 ..." and a grid over four lines are fine); the rest must be exactly 16 characters, each
a digit 1-4, else it is no answer (both rewards 0).

Correctness reward (`sudoku_correctness_reward`, 1.0 / 0.0): 1.0 when the answer is a valid complete grid (every
row, column and 2x2 box a permutation of 1-4) that keeps every given of the puzzle. It does not need the
`solution` column (a puzzle with a unique solution has one such grid).
Partial-credit reward (`sudoku_cell_accuracy_reward`, in [0, 1]; d1's Sudoku reward): the fraction of the puzzle's
blank cells whose digit equals the solution's (from the `solution` column, or solved here when it is absent or
None; None when the puzzle has no unique solution). Givens are not counted; a puzzle with no blank scores 1.0 for
a well-formed answer equal to it, else 0.0.
Format reward (`sudoku_format_reward`, at most 0.5): 0.25 for the <reasoning>/<answer> layout, plus 0.25 when
the answer is 16 digits 1-4 by the rule above.

Official style (`prompt_style="official"`, as the official StableDRL code poses and grades 4x4 Sudoku):
  - prompt: "Solve this 4x4 Sudoku puzzle: 1030000000000002. Use 0 for empty cells." followed by `OFFICIAL_REQUEST`
    (reasoning in <reasoning> tags, the solution string in <answer> tags). Data files may use the official
    column names `Puzzle` / `Solution` (d1's CSV) as well as `puzzle` / `solution`.
  - reward (`sudoku_official_reward`, in [0, 1]): the characters of the LAST <answer> match (read as the official
    code reads it, `common.official_last_answer`) for which `str.isdigit` holds, joined (so any separators, and
    any digit 0-9, are allowed), then padded with "0" or cut to 16 characters; the score is the fraction of the
    puzzle's blank cells where that string has the solution's digit. No tags, no digit in them, or a puzzle without
    a blank: 0.0. The givens are never scored (a grid that breaks them can still score 1.0).
"""

from __future__ import annotations

import functools
import hashlib
import random

from .common import (
    ANSWER_FORMAT_INSTRUCTIONS,
    choose_format,
    completion_to_text,
    extract_final_answer,
    format_dataset,
    format_score,
    load_rows,
    official_last_answer,
    reward_column,
    take_samples,
    user_prompt,
)

SIZE = 4
CELLS = SIZE * SIZE
DIGITS = "1234"
TEST_BUCKETS = 8
MAX_BLANKS = 12  # a 4x4 Sudoku with a unique solution has at least 4 givens
DEFAULT_NUM_SAMPLES = {"train": 2048, "test": 256}
DEFAULT_BLANKS = (6, 10)
OFFICIAL_REQUEST = " Please put the reasoning in <reasoning> tags and the solution string in <answer> tags."
SYSTEM_PROMPT = (
    ANSWER_FORMAT_INSTRUCTIONS + "\nInside the answer tags, write the 16 digits of the solved grid row by row, "
    "for example <answer>1234341221434321</answer>."
)

# The 12 groups (4 rows, 4 columns, 4 boxes) as lists of cell indices (row-major).
GROUPS = (
    [[r * SIZE + c for c in range(SIZE)] for r in range(SIZE)]
    + [[r * SIZE + c for r in range(SIZE)] for c in range(SIZE)]
    + [[(br + r) * SIZE + bc + c for r in range(2) for c in range(2)] for br in (0, 2) for bc in (0, 2)]
)
_PEERS = [sorted({j for group in GROUPS if i in group for j in group} - {i}) for i in range(CELLS)]


def normalize_puzzle(puzzle: str) -> str:
    """A puzzle with "." blanks written as "0"; raises ValueError unless 16 characters from "0.1234".

    An int or integral float (a CSV column of digit strings read as numbers; floats hold every 16-digit grid exactly,
    as 4444444444444444 < 2**53) is left-padded with the zeros the conversion dropped.
    """
    if isinstance(puzzle, float) and puzzle.is_integer():
        puzzle = int(puzzle)
    text = str(puzzle).zfill(CELLS) if isinstance(puzzle, int) else str(puzzle).strip().replace(".", "0")
    if len(text) != CELLS or any(char not in "01234" for char in text):
        raise ValueError(
            f"puzzle: expected 16 characters, each 0 or . (blank) or a digit 1-4, got {puzzle!r}; write the grid "
            "row by row, e.g. '1.3..4.........2'"
        )
    return text


def parse_grid_answer(answer: str | None) -> str | None:
    """The 16-digit grid of an answer (whitespace, "," and "|" dropped), or None unless exactly 16 digits 1-4."""
    if answer is None:
        return None
    grid = "".join(char for char in answer if not char.isspace() and char not in ",|")
    if len(grid) != CELLS or any(char not in DIGITS for char in grid):
        return None
    return grid


def is_valid_solution(grid: str) -> bool:
    """True when the 16 digits fill every row, column and 2x2 box with 1, 2, 3, 4 once each."""
    return len(grid) == CELLS and all(sorted(grid[i] for i in group) == list(DIGITS) for group in GROUPS)


def keeps_givens(grid: str, puzzle: str) -> bool:
    """True when `grid` has the puzzle's digit at every given (non-blank) cell."""
    return all(p == "0" or p == g for p, g in zip(puzzle, grid))


@functools.cache
def all_grids() -> tuple[str, ...]:
    """Every valid complete 4x4 grid (there are 288), sorted, found by exhaustive backtracking."""
    grids: list[str] = []
    cells = ["0"] * CELLS

    def fill(i: int) -> None:
        if i == CELLS:
            grids.append("".join(cells))
            return
        for digit in DIGITS:
            if all(cells[j] != digit for j in _PEERS[i]):
                cells[i] = digit
                fill(i + 1)
        cells[i] = "0"

    fill(0)
    return tuple(sorted(grids))


@functools.cache
def _grid_masks() -> dict[tuple[int, str], int]:
    """(cell, digit) -> bitmask over `all_grids()` of the grids with that digit at that cell."""
    masks = {(i, d): 0 for i in range(CELLS) for d in DIGITS}
    for k, grid in enumerate(all_grids()):
        for i, digit in enumerate(grid):
            masks[i, digit] |= 1 << k
    return masks


def _consistent_grids(puzzle: str) -> int:
    """Bitmask over `all_grids()` of the grids that keep the givens of a normalised puzzle."""
    masks = _grid_masks()
    consistent = (1 << len(all_grids())) - 1
    for i, digit in enumerate(puzzle):
        if digit != "0":
            consistent &= masks[i, digit]
    return consistent


def solve(puzzle: str, limit: int | None = 2) -> list[str]:
    """The solutions of a puzzle (at most `limit`, in sorted order): the complete grids that keep its givens.

    Intersects, over the givens, the sets of the 288 grids holding that digit at that cell (bitmasks).
    """
    consistent = _consistent_grids(normalize_puzzle(puzzle))
    solutions: list[str] = []
    while consistent and (limit is None or len(solutions) < limit):
        lowest = consistent & -consistent
        solutions.append(all_grids()[lowest.bit_length() - 1])
        consistent ^= lowest
    return solutions


def puzzle_split(puzzle: str) -> str:
    """Which split, "test" or "train", a puzzle belongs to: fixed by the MD5 of the normalised puzzle string."""
    return "test" if hashlib.md5(normalize_puzzle(puzzle).encode()).digest()[0] % TEST_BUCKETS == 0 else "train"


def _blank_out(solution: str, num_blanks: int, rng: random.Random) -> str | None:
    """Blank cells of `solution` in a random order, keeping only removals that leave a unique solution."""
    cells = list(solution)
    order = list(range(CELLS))
    rng.shuffle(order)
    blanks = 0
    for i in order:
        if blanks == num_blanks:
            break
        digit, cells[i] = cells[i], "0"
        if _consistent_grids(cells).bit_count() == 1:
            blanks += 1
        else:
            cells[i] = digit
    return "".join(cells) if blanks == num_blanks else None


def generate_puzzles(
    num_puzzles: int,
    seed: int,
    *,
    blanks: int | tuple[int, int] = DEFAULT_BLANKS,
    split: str | None = None,
    max_attempts: int = 100_000,
) -> list[dict[str, str]]:
    """`num_puzzles` distinct 4x4 puzzles with unique solutions: [{"puzzle": ..., "solution": ...}, ...].

    Deterministic in (`num_puzzles`, `seed`, `blanks`, `split`) through `random.Random(seed)`. Each puzzle's blank
    count is drawn uniformly from the `blanks` range (inclusive; an int means exactly that many). With `split`
    ("train"/"test") only puzzles of that split (see `puzzle_split`) are kept.
    """
    low, high = (blanks, blanks) if isinstance(blanks, int) else tuple(blanks)
    if not (1 <= low <= high <= MAX_BLANKS):
        raise ValueError(
            f"blanks: expected an int or a (low, high) range with 1 <= low <= high <= {MAX_BLANKS}, got {blanks!r}"
        )
    if split not in (None, "train", "test"):
        raise ValueError(f"split: expected None, 'train' or 'test', got {split!r}")
    if num_puzzles < 0:
        raise ValueError(f"num_puzzles: expected a non-negative integer, got {num_puzzles}")
    rng = random.Random(seed)
    puzzles: list[dict[str, str]] = []
    seen: set[str] = set()
    for _ in range(max_attempts):
        if len(puzzles) == num_puzzles:
            return puzzles
        solution = rng.choice(all_grids())
        puzzle = _blank_out(solution, rng.randint(low, high), rng)
        if puzzle is None or puzzle in seen or (split is not None and puzzle_split(puzzle) != split):
            continue
        seen.add(puzzle)
        puzzles.append({"puzzle": puzzle, "solution": solution})
    if len(puzzles) == num_puzzles:
        return puzzles
    raise RuntimeError(
        f"generate_puzzles: found only {len(puzzles)} of {num_puzzles} distinct puzzles in {max_attempts} attempts; "
        "ask for fewer puzzles or a wider blanks range"
    )


def _solution_for(puzzle: str, solution: str | None) -> str | None:
    if solution is not None and str(solution).strip():
        grid = normalize_puzzle(solution)
        if not (is_valid_solution(grid) and keeps_givens(grid, puzzle)):
            raise ValueError(
                f"solution: {solution!r} is not a complete valid grid keeping the givens of puzzle {puzzle!r}; fix "
                "the data or leave the solution empty to have it solved"
            )
        return grid
    solutions = solve(puzzle, limit=2)
    return solutions[0] if len(solutions) == 1 else None


def sudoku_correctness_reward(prompts, completions, **kwargs) -> list[float | None]:
    """1.0 when the answer is a valid complete grid that keeps the puzzle's givens, else 0.0 (None: no puzzle)."""
    puzzles = reward_column(kwargs, "puzzle", len(completions), "sudoku_correctness_reward")
    rewards: list[float | None] = []
    for completion, puzzle in zip(completions, puzzles):
        if puzzle is None:
            rewards.append(None)
            continue
        puzzle = normalize_puzzle(puzzle)
        grid = parse_grid_answer(extract_final_answer(completion_to_text(completion)))
        rewards.append(1.0 if grid is not None and is_valid_solution(grid) and keeps_givens(grid, puzzle) else 0.0)
    return rewards


def _puzzles_and_solutions(kwargs: dict, n: int, reward_name: str) -> list[tuple[str, str] | None]:
    """Per completion, the normalised puzzle and its solution (the `solution` column, else solved), or None when
    the row has no puzzle or its puzzle has no unique solution."""
    puzzles = reward_column(kwargs, "puzzle", n, reward_name)
    solutions = kwargs.get("solution") or [None] * n
    if len(solutions) != n:
        raise ValueError(f"{reward_name}: column 'solution' has {len(solutions)} entries for {n}")
    rows: list[tuple[str, str] | None] = []
    for puzzle, solution in zip(puzzles, solutions):
        if puzzle is None:
            rows.append(None)
            continue
        puzzle = normalize_puzzle(puzzle)
        solution = _solution_for(puzzle, solution)
        rows.append(None if solution is None else (puzzle, solution))
    return rows


def sudoku_cell_accuracy_reward(prompts, completions, **kwargs) -> list[float | None]:
    """Fraction of the puzzle's blank cells the answer fills with the solution's digit (0.0 for no answer)."""
    rows = _puzzles_and_solutions(kwargs, len(completions), "sudoku_cell_accuracy_reward")
    rewards: list[float | None] = []
    for completion, row in zip(completions, rows):
        if row is None:
            rewards.append(None)
            continue
        puzzle, solution = row
        grid = parse_grid_answer(extract_final_answer(completion_to_text(completion)))
        if grid is None:
            rewards.append(0.0)
            continue
        blanks = [i for i in range(CELLS) if puzzle[i] == "0"]
        if not blanks:
            rewards.append(1.0 if grid == solution else 0.0)
            continue
        rewards.append(sum(grid[i] == solution[i] for i in blanks) / len(blanks))
    return rewards


def sudoku_format_reward(prompts, completions, **kwargs) -> list[float]:
    """0.25 for the reasoning/answer layout + 0.25 when the answer is 16 digits 1-4."""
    return [format_score(completion_to_text(c), lambda a: parse_grid_answer(a) is not None) for c in completions]


def sudoku_official_score(text: str, puzzle: str, solution: str) -> float:
    """The official Sudoku score of a completion against a normalised puzzle and its solution (module docstring)."""
    answer = official_last_answer(text)
    digits = "" if answer is None else "".join(char for char in answer if char.isdigit())
    blanks = [i for i in range(CELLS) if puzzle[i] == "0"]
    if not digits or not blanks:
        return 0.0
    grid = digits[:CELLS].ljust(CELLS, "0")
    return sum(grid[i] == solution[i] for i in blanks) / len(blanks)


def sudoku_official_reward(prompts, completions, **kwargs) -> list[float | None]:
    """The official Sudoku grading: the fraction of blank cells right (None: no puzzle, or no unique solution)."""
    rows = _puzzles_and_solutions(kwargs, len(completions), "sudoku_official_reward")
    return [
        None if row is None else sudoku_official_score(completion_to_text(completion), *row)
        for completion, row in zip(completions, rows)
    ]


def _row_puzzle_solution(row: dict) -> tuple[str, str | None]:
    """The normalised puzzle of a row (column `puzzle` or `Puzzle`) and its solution (given, or solved)."""
    key = "puzzle" if row.get("puzzle") is not None else "Puzzle"
    if row.get(key) is None:
        raise ValueError(f"sudoku: a row needs a 'puzzle' (or 'Puzzle') column, got columns {sorted(row)}")
    puzzle = normalize_puzzle(row[key])
    solution = row.get("solution") if row.get("solution") is not None else row.get("Solution")
    return puzzle, _solution_for(puzzle, solution)


def render_grid(puzzle: str) -> str:
    """Four lines of four space-separated digits, 0 for a blank."""
    puzzle = normalize_puzzle(puzzle)
    return "\n".join(" ".join(puzzle[r * SIZE : (r + 1) * SIZE]) for r in range(SIZE))


def format_example(row: dict, system_prompt: str = SYSTEM_PROMPT) -> dict:
    """A row with `puzzle` (and optional `solution`) -> {"prompt", "puzzle", "solution"} (solution solved if absent)."""
    puzzle, solution = _row_puzzle_solution(row)
    question = (
        "Solve this 4x4 Sudoku. Fill every 0 with a digit from 1 to 4 so that each row, each column and each of "
        "the four 2x2 boxes contains 1, 2, 3 and 4 exactly once. The grid, row by row:\n" + render_grid(puzzle)
    )
    return {"prompt": user_prompt(question, system_prompt), "puzzle": puzzle, "solution": solution}


def format_example_official(row: dict, system_prompt: str = "") -> dict:
    """A row with `puzzle` (and optional `solution`) -> {"prompt": [the official question], "puzzle", "solution"}."""
    puzzle, solution = _row_puzzle_solution(row)
    question = f"Solve this 4x4 Sudoku puzzle: {puzzle}. Use 0 for empty cells.{OFFICIAL_REQUEST}"
    return {"prompt": user_prompt(question, None), "puzzle": puzzle, "solution": solution}


def load_sudoku(
    split: str = "train",
    *,
    path: str | None = None,
    data_files=None,
    num_samples: int | None = None,
    system_prompt: str | None = None,
    seed: int = 0,
    prompt_style: str = "tagged",
):
    """4x4 Sudoku as a conversational dataset with columns `prompt`, `puzzle` and `solution`.

    With `path`/`data_files`: the rows of that local CSV/JSON(L) file (or dataset). Without: `num_samples` puzzles
    (default 2048 for "train", 256 for "test") from `generate_puzzles(seed=seed, split=split)`.
    """
    from datasets import Dataset

    formatter, instructions = choose_format(
        "sudoku", prompt_style, system_prompt, format_example, format_example_official, SYSTEM_PROMPT
    )
    if path is None and data_files is None:
        if split not in DEFAULT_NUM_SAMPLES:
            raise ValueError(f"split: generated Sudoku puzzles come as 'train' or 'test', got {split!r}")
        count = DEFAULT_NUM_SAMPLES[split] if num_samples is None else num_samples
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"num_samples: expected a positive integer or None, got {num_samples!r}")
        rows = Dataset.from_list(generate_puzzles(count, seed, split=split))
    else:
        rows = take_samples(load_rows(split, path=path, config=None, data_files=data_files), num_samples, seed)
    return format_dataset(rows, formatter, instructions)
