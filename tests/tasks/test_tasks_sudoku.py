"""Tests for 4x4 Sudoku: grid rules, the solver, the puzzle generator, the rewards and row formatting."""

import itertools

import pytest

from stabledrl_trl.tasks.sudoku import (
    all_grids,
    format_example,
    generate_puzzles,
    is_valid_solution,
    keeps_givens,
    normalize_puzzle,
    parse_grid_answer,
    puzzle_split,
    solve,
    sudoku_cell_accuracy_reward,
    sudoku_correctness_reward,
    sudoku_format_reward,
)

SOLUTION = "1234341221434321"  # rows 1234 / 3412 / 2143 / 4321
PUZZLE = "1030001221004000"  # rows 1.3. / ..12 / 21.. / 4...: 7 givens, 9 blanks


def reference_valid(grid):
    """Independent check: rows, columns and boxes written out by hand."""
    rows = [grid[4 * r : 4 * r + 4] for r in range(4)]
    cols = ["".join(rows[r][c] for r in range(4)) for c in range(4)]
    boxes = ["".join(rows[r][c] for r in (br, br + 1) for c in (bc, bc + 1)) for br in (0, 2) for bc in (0, 2)]
    return all(sorted(unit) == ["1", "2", "3", "4"] for unit in rows + cols + boxes)


def reference_solutions(puzzle):
    """Brute force: every choice of rows (permutations of 1234 matching the row's givens), checked by hand rules."""
    perms = ["".join(p) for p in itertools.permutations("1234")]
    options = [
        [p for p in perms if all(g in ("0", d) for g, d in zip(puzzle[4 * r : 4 * r + 4], p))] for r in range(4)
    ]
    grids = ("".join(rows) for rows in itertools.product(*options))
    return sorted(g for g in grids if reference_valid(g))


def test_fixture_puzzle_is_consistent():
    assert reference_valid(SOLUTION) and keeps_givens(SOLUTION, PUZZLE)
    assert reference_solutions(PUZZLE) == [SOLUTION]


def test_all_grids_are_the_288_valid_grids():
    grids = all_grids()
    assert len(grids) == 288 == len(set(grids))
    assert all(reference_valid(g) for g in grids)
    # Independently: the valid grids with first row 1234, from all 24**3 choices of the other rows.
    perms = ["".join(p) for p in itertools.permutations("1234")]
    first_row_1234 = {
        "1234" + a + b + c for a in perms for b in perms for c in perms if reference_valid("1234" + a + b + c)
    }
    assert first_row_1234 == {g for g in grids if g.startswith("1234")}
    assert len(first_row_1234) == 12


@pytest.mark.parametrize(
    "puzzle, count",
    [
        (PUZZLE, 1),
        # Row 2 takes {2,4} in columns 0 and 2 and {1,3} in columns 1 and 3, in either order each; row 3 the rest.
        ("1234341200000000", 4),
        ("0000000021434321", 4),
        ("1100341221434321", 0),  # the givens clash
        (SOLUTION, 1),
    ],
)
def test_solve_matches_brute_force(puzzle, count):
    reference = sorted(reference_solutions(puzzle))
    assert len(reference) == count
    assert solve(puzzle, limit=None) == reference
    assert solve(puzzle, limit=1) == reference[:1]
    assert len(solve("0" * 16, limit=None)) == 288


def test_normalize_puzzle():
    assert normalize_puzzle("1.3...21..0.4...") == "1030002100004000"
    assert normalize_puzzle(30002121004000) == "0030002121004000"  # a CSV column read as an integer
    assert normalize_puzzle(4444444444444444.0) == "4" * 16  # ... or as a float (a column with missing values)
    with pytest.raises(ValueError, match="puzzle"):
        normalize_puzzle(1.5)
    for bad in ("123", "1" * 17, "5" + "0" * 15, "a" * 16):
        with pytest.raises(ValueError, match="puzzle"):
            normalize_puzzle(bad)


def test_generator_is_deterministic_valid_and_unique():
    puzzles = generate_puzzles(40, seed=7, blanks=(6, 10))
    assert puzzles == generate_puzzles(40, seed=7, blanks=(6, 10))
    assert puzzles != generate_puzzles(40, seed=8, blanks=(6, 10))
    assert len({p["puzzle"] for p in puzzles}) == 40
    for p in puzzles:
        assert 6 <= p["puzzle"].count("0") <= 10
        assert reference_solutions(p["puzzle"]) == [p["solution"]]  # unique solution, the stored one


def test_generator_exact_blank_count_and_splits():
    hard = generate_puzzles(5, seed=0, blanks=12)
    assert all(p["puzzle"].count("0") == 12 and len(reference_solutions(p["puzzle"])) == 1 for p in hard)
    train = generate_puzzles(200, seed=1, split="train")
    test = generate_puzzles(30, seed=1, split="test")
    assert all(puzzle_split(p["puzzle"]) == "train" for p in train)
    assert all(puzzle_split(p["puzzle"]) == "test" for p in test)
    assert not {p["puzzle"] for p in train} & {p["puzzle"] for p in test}
    for bad in (0, 13, (5, 4)):
        with pytest.raises(ValueError, match="blanks"):
            generate_puzzles(1, seed=0, blanks=bad)


def test_grid_helpers():
    assert parse_grid_answer("1234 3412\n2143 4321") == SOLUTION
    assert parse_grid_answer("1,2,3,4|3,4,1,2|2,1,4,3|4,3,2,1") == SOLUTION
    assert parse_grid_answer("123434122143432") is None  # 15 digits
    assert parse_grid_answer("12343412214343210") is None  # 17 digits
    assert parse_grid_answer("1234341221434325") is None  # digit 5
    assert parse_grid_answer("123434122143432x") is None
    assert parse_grid_answer(None) is None
    assert is_valid_solution(SOLUTION)
    assert not is_valid_solution("1234123412341234")  # rows fine, columns repeat
    assert not is_valid_solution("1234214334124321")  # rows and columns fine, top-left box holds 1,2,2,1


def test_correctness_reward_exact_values():
    wrong_givens = "2134341212434321"  # a valid grid, but it changes the given 1 at cell 0
    assert reference_valid(wrong_givens) and not keeps_givens(wrong_givens, PUZZLE)
    completions = [
        f"<reasoning>r</reasoning><answer>{SOLUTION}</answer>",
        "<answer>\n1234\n3412\n2143\n4321\n</answer>",
        rf"\boxed{{{SOLUTION}}}",
        [{"role": "assistant", "content": f"<answer>{SOLUTION}</answer>"}],
        f"<answer>{wrong_givens}</answer>",  # violates the givens
        "<answer>1234341221434312</answer>",  # keeps givens, invalid grid (last row 4312)
        f"<answer>{SOLUTION[:15]}</answer>",  # wrong length
        f"<answer>{PUZZLE}</answer>",  # the unsolved puzzle (zeros)
        SOLUTION,  # no tag, no box
        "",
    ]
    n = len(completions)
    rewards = sudoku_correctness_reward(None, completions, puzzle=[PUZZLE] * n)
    assert rewards == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert sudoku_correctness_reward(None, ["x"], puzzle=[None]) == [None]


def test_cell_accuracy_reward_exact_values():
    blanks = [i for i, c in enumerate(PUZZLE) if c == "0"]
    assert blanks == [1, 3, 4, 5, 10, 11, 13, 14, 15]
    two_wrong = list(SOLUTION)
    for i in blanks[:2]:
        two_wrong[i] = "4" if SOLUTION[i] != "4" else "1"
    two_wrong = "".join(two_wrong)
    completions = [
        f"<answer>{SOLUTION}</answer>",
        f"<answer>{two_wrong}</answer>",  # 7 of 9 blanks right
        f"<answer>{PUZZLE.replace('0', '1')}</answer>",  # blanks all 1
        f"<answer>{SOLUTION[:15]}</answer>",  # malformed: no credit
        "",
    ]
    n = len(completions)
    rewards = sudoku_cell_accuracy_reward(None, completions, puzzle=[PUZZLE] * n, solution=[SOLUTION] * n)
    # SOLUTION's digits at the blanks are 2,4,3,4,4,3,3,2,1: only blank 15 holds a 1, so 1 of 9.
    assert rewards == [1.0, 7 / 9, 1 / 9, 0.0, 0.0]
    # Without a solution column the puzzle is solved; a puzzle with several solutions gets None.
    assert sudoku_cell_accuracy_reward(None, completions[:2], puzzle=[PUZZLE] * 2) == [1.0, 7 / 9]
    assert sudoku_cell_accuracy_reward(None, completions[:1], puzzle=["1" + "0" * 15]) == [None]


def test_format_reward_exact_values():
    completions = [
        f"<reasoning>r</reasoning>\n<answer>{SOLUTION}</answer>",
        "<reasoning>r</reasoning>\n<answer>1234341221434321 done</answer>",
        f"<answer>{SOLUTION}</answer>",
        "<answer>1111111111111111</answer>",  # well-formed even though invalid
        "",
    ]
    assert sudoku_format_reward(None, completions) == [0.5, 0.25, 0.25, 0.25, 0.0]


def test_format_example_on_a_local_dataset():
    from datasets import Dataset

    rows = Dataset.from_list(
        [{"puzzle": "1.3...1221..4...", "solution": SOLUTION}, {"puzzle": PUZZLE, "solution": ""}]
    )
    out = rows.map(format_example, remove_columns=rows.column_names)
    assert sorted(out.column_names) == ["prompt", "puzzle", "solution"]
    assert out["puzzle"] == [PUZZLE, PUZZLE]
    assert out["solution"] == [SOLUTION, SOLUTION]  # the empty one solved
    content = out[0]["prompt"][0]["content"]
    assert "1 0 3 0\n0 0 1 2\n2 1 0 0\n4 0 0 0" in content
    with pytest.raises(ValueError, match="solution"):
        format_example({"puzzle": PUZZLE, "solution": "2134341212434321"})
