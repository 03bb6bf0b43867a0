"""Generator of the math word problems the `math` env ships (jobs/envs/math/problems.jsonl).

Arithmetic, algebra, number theory, combinatorics and probability problems from
templates, with exact answers (integers or reduced fractions) computed here with
`fractions.Fraction`. Deterministic: problem i of seed s draws from random.Random(s, i).

    .venv/bin/python -m thicket.envs.math.problems            # rewrite the shipped file
    .venv/bin/python -m thicket.envs.math.problems --check    # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Callable
from fractions import Fraction
from itertools import combinations
from pathlib import Path

DATA_FILE = Path(__file__).with_name("problems.jsonl")
DEFAULT_COUNT = 360
DEFAULT_SEED = 2024

Problem = tuple[str, str, Fraction | int]  # topic, question, answer
Template = Callable[[random.Random], Problem]

NAMES = ("Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Luis")


def _a(n: int) -> str:
    """The article before a spoken number: "an 80%", "a 75%"."""
    return "an" if str(n).startswith("8") or n in (11, 18) else "a"


def fmt(value: Fraction | int) -> str:
    value = Fraction(value)
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _primes_upto(n: int) -> list[int]:
    sieve = bytearray([1]) * (n + 1)
    sieve[:2] = b"\x00\x00"
    for p in range(2, math.isqrt(n) + 1):
        if sieve[p]:
            sieve[p * p :: p] = bytearray(len(sieve[p * p :: p]))
    return [i for i, is_prime in enumerate(sieve) if is_prime]


# --- arithmetic ----------------------------------------------------------------------


def shopping(rng: random.Random) -> Problem:
    who = rng.choice(NAMES)
    a, b = rng.randint(2, 15), rng.randint(1, 9)
    n, m = rng.randint(2, 9), rng.randint(2, 12)
    total = a * n + b * m
    bill = next(x for x in (20, 50, 100, 200) if x > total)
    q = (
        f"A notebook costs ${a} and a pen costs ${b}. {who} buys {n} notebooks and {m} pens "
        f"and pays with a ${bill} bill. How much change, in dollars, does {who} get?"
    )
    return "arithmetic", q, bill - total


def pipes(rng: random.Random) -> Problem:
    a, b = rng.sample(range(2, 13), 2)
    q = (
        f"Pipe A alone fills a tank in {a} hours and pipe B alone fills it in {b} hours. "
        "How many hours do both pipes take to fill the empty tank together?"
    )
    return "arithmetic", q, Fraction(a * b, a + b)


def average_speed(rng: random.Random) -> Problem:
    d1, d2 = rng.randint(2, 30) * 10, rng.randint(2, 30) * 10
    v1, v2 = rng.sample((30, 40, 45, 50, 60, 75, 80, 90, 100, 120), 2)
    q = (
        f"A train travels {d1} km at {v1} km/h and then {d2} km at {v2} km/h. "
        "What is its average speed over the whole trip, in km/h?"
    )
    return "arithmetic", q, Fraction(d1 + d2) / (Fraction(d1, v1) + Fraction(d2, v2))


def percent_change(rng: random.Random) -> Problem:
    p = rng.randint(4, 60) * 5
    x, y = rng.randint(1, 10) * 5, rng.randint(1, 10) * 5
    q = (
        f"A jacket costs ${p}. Its price is raised by {x}% and the new price is then "
        f"lowered by {y}%. What is the final price in dollars?"
    )
    return "arithmetic", q, Fraction(p) * (100 + x) / 100 * (100 - y) / 100


def fraction_sum(rng: random.Random) -> Problem:
    terms = [Fraction(rng.randint(1, 9), rng.randint(2, 12)) for _ in range(3)]
    q = f"Compute {terms[0]} + {terms[1]} - {terms[2]} and give the result as a fraction in lowest terms."
    return "arithmetic", q, terms[0] + terms[1] - terms[2]


def mixture(rng: random.Random) -> Problem:
    v = rng.randint(2, 20)
    q_pct, p_pct = rng.sample(range(5, 95, 5), 2)
    lo, hi = sorted((q_pct, p_pct))
    r_pct = rng.choice([x for x in range(lo + 1, hi) if x % 5 == 0] or [lo + 1])
    # v*q + x*p = (v + x)*r  ->  x = v (r - q) / (p - r)
    x = Fraction(v * (r_pct - q_pct), p_pct - r_pct)
    q = (
        f"How many liters of {_a(p_pct)} {p_pct}% acid solution must be added to {v} liters of "
        f"{_a(q_pct)} {q_pct}% acid solution to obtain {_a(r_pct)} {r_pct}% acid solution?"
    )
    return "arithmetic", q, x


# --- algebra -------------------------------------------------------------------------


def linear_equation(rng: random.Random) -> Problem:
    a, c = rng.sample([k for k in range(-9, 10) if k], 2)
    b, d = rng.randint(-20, 20), rng.randint(-20, 20)
    q = f"Solve for x: {a}x + {b} = {c}x + {d}.".replace("+ -", "- ")
    return "algebra", q, Fraction(d - b, a - c)


def linear_system(rng: random.Random) -> Problem:
    x, y = rng.randint(-12, 12), rng.randint(-12, 12)
    while True:
        a, b, c, d = (rng.choice([k for k in range(-6, 7) if k]) for _ in range(4))
        if a * d - b * c:
            break
    e, f = a * x + b * y, c * x + d * y
    q = f"If {a}x + {b}y = {e} and {c}x + {d}y = {f}, what is x * y?".replace("+ -", "- ")
    return "algebra", q, x * y


def quadratic_root(rng: random.Random) -> Problem:
    r1, r2 = rng.sample(range(-15, 16), 2)
    b, c = -(r1 + r2), r1 * r2
    q = f"The equation x^2 + {b}x + {c} = 0 has two integer roots. What is the larger root?"
    return "algebra", q.replace("+ -", "- "), max(r1, r2)


def ages(rng: random.Random) -> Problem:
    a, b = rng.sample(NAMES, 2)
    bob, years, times = rng.randint(3, 20), rng.randint(2, 15), rng.randint(2, 4)
    alice = times * (bob + years) - years
    q = (
        f"The sum of {a}'s and {b}'s ages is {alice + bob}. In {years} years, {a} will be "
        f"{times} times as old as {b}. How old is {b} now?"
    )
    return "algebra", q, bob


def geometric_sum(rng: random.Random) -> Problem:
    a, n = rng.randint(1, 9), rng.randint(4, 10)
    ratio = rng.choice([Fraction(2), Fraction(3), Fraction(1, 2), Fraction(-2), Fraction(2, 3)])
    total = sum(a * ratio**k for k in range(n))
    q = f"A geometric sequence has first term {a} and common ratio {ratio}. What is the sum of its first {n} terms?"
    return "algebra", q, total


def rectangle_diagonal(rng: random.Random) -> Problem:
    length, width = rng.sample(range(2, 40), 2)
    q = (
        f"A rectangle has perimeter {2 * (length + width)} and area {length * width}. "
        "What is the square of the length of its diagonal?"
    )
    return "algebra", q, length**2 + width**2


# --- number theory -------------------------------------------------------------------


def lcm3(rng: random.Random) -> Problem:
    a, b, c = rng.sample(range(4, 60), 3)
    return "number theory", f"What is the least common multiple of {a}, {b} and {c}?", math.lcm(a, b, c)


def gcd_pair(rng: random.Random) -> Problem:
    g = rng.randint(2, 40)
    a, b = g * rng.randint(10, 90), g * rng.randint(10, 90)
    return "number theory", f"What is the greatest common divisor of {a} and {b}?", math.gcd(a, b)


def power_mod(rng: random.Random) -> Problem:
    a, n, m = rng.randint(2, 19), rng.randint(50, 5000), rng.randint(7, 97)
    return "number theory", f"What is the remainder when {a}^{n} is divided by {m}?", pow(a, n, m)


def digit_sum(rng: random.Random) -> Problem:
    if rng.random() < 0.5:
        n = rng.randint(20, 60)
        return "number theory", f"What is the sum of the digits of {n}! (n factorial)?", sum(map(int, str(math.factorial(n))))
    n = rng.randint(50, 300)
    return "number theory", f"What is the sum of the digits of 2^{n}?", sum(map(int, str(2**n)))


def divisor_count(rng: random.Random) -> Problem:
    n = rng.randint(2, 40) * rng.choice((6, 12, 30, 36, 60, 210))
    count = sum(1 for d in range(1, n + 1) if n % d == 0)
    return "number theory", f"How many positive divisors does {n} have?", count


def prime_count(rng: random.Random) -> Problem:
    a = rng.randint(1, 500)
    b = a + rng.randint(50, 1500)
    count = sum(1 for p in _primes_upto(b) if p >= a)
    return "number theory", f"How many prime numbers are there between {a} and {b}, inclusive?", count


def divisible_count(rng: random.Random) -> Problem:
    n = rng.randint(100, 5000)
    a, b = rng.sample((2, 3, 4, 5, 6, 7, 9, 11, 13), 2)
    count = n // a + n // b - n // math.lcm(a, b)
    return "number theory", f"How many integers from 1 to {n} are divisible by {a} or by {b}?", count


def crt(rng: random.Random) -> Problem:
    m = rng.choice([(3, 5, 7), (4, 5, 9), (5, 7, 8), (3, 7, 11), (4, 9, 11), (5, 8, 9)])
    x = rng.randint(1, math.prod(m) - 1)
    rest = [x % k for k in m]
    q = (
        f"What is the smallest positive integer that leaves remainder {rest[0]} when divided by "
        f"{m[0]}, remainder {rest[1]} when divided by {m[1]}, and remainder {rest[2]} when divided by {m[2]}?"
    )
    return "number theory", q, x


def base_conversion(rng: random.Random) -> Problem:
    base = rng.choice((2, 3, 5, 7, 8, 16))
    value = rng.randint(base**3, base**6)
    digits = "0123456789ABCDEF"
    text, v = "", value
    while v:
        text, v = digits[v % base] + text, v // base
    return "number theory", f"What is the base-10 value of the base-{base} number {text}?", value


def multiples_sum(rng: random.Random) -> Problem:
    k, n = rng.randint(3, 17), rng.randint(100, 2000)
    top = n // k
    return "number theory", f"What is the sum of all multiples of {k} from 1 to {n}, inclusive?", k * top * (top + 1) // 2


# --- combinatorics and probability ---------------------------------------------------


def committee(rng: random.Random) -> Problem:
    n = rng.randint(6, 20)
    k = rng.randint(2, min(6, n - 1))
    q = f"In how many ways can a committee of {k} people be chosen from a group of {n} people?"
    return "combinatorics", q, math.comb(n, k)


def arrangements(rng: random.Random) -> Problem:
    word = rng.choice(("BANANA", "LETTER", "MISSISSIPPI", "BALLOON", "COFFEE", "PEPPER", "TOMATO", "ASSESS", "COMMITTEE", "STATISTICS"))
    count = math.factorial(len(word))
    for letter in set(word):
        count //= math.factorial(word.count(letter))
    return "combinatorics", f"How many distinct arrangements of the letters of the word {word} are there?", count


def dice_sum(rng: random.Random) -> Problem:
    faces = rng.choice((4, 6, 8))
    target = rng.randint(3, 2 * faces - 1)
    hits = sum(1 for a in range(1, faces + 1) for b in range(1, faces + 1) if a + b == target)
    q = f"Two fair {faces}-sided dice (faces 1 to {faces}) are rolled. What is the probability that the sum is {target}?"
    return "probability", q, Fraction(hits, faces * faces)


def draw_balls(rng: random.Random) -> Problem:
    red, blue = rng.randint(2, 9), rng.randint(2, 9)
    k = rng.randint(2, min(3, red))
    q = (
        f"A bag holds {red} red and {blue} blue marbles. {k} marbles are drawn at random without "
        f"replacement. What is the probability that all {k} are red?"
    )
    return "probability", q, Fraction(math.comb(red, k), math.comb(red + blue, k))


def subset_sums(rng: random.Random) -> Problem:
    items = sorted(rng.sample(range(1, 30), 6))
    target = sum(rng.sample(items, 3))
    count = sum(1 for c in combinations(items, 3) if sum(c) == target)
    q = f"How many 3-element subsets of {{{', '.join(map(str, items))}}} have elements that sum to {target}?"
    return "combinatorics", q, count


TEMPLATES: tuple[Template, ...] = (
    shopping, pipes, average_speed, percent_change, fraction_sum, mixture,
    linear_equation, linear_system, quadratic_root, ages, geometric_sum, rectangle_diagonal,
    lcm3, gcd_pair, power_mod, digit_sum, divisor_count, prime_count, divisible_count, crt,
    base_conversion, multiples_sum, committee, arrangements, dice_sum, draw_balls, subset_sums,
)


def generate(count: int = DEFAULT_COUNT, seed: int = DEFAULT_SEED) -> list[dict[str, str]]:
    problems: list[dict[str, str]] = []
    seen: set[str] = set()
    i = 0
    while len(problems) < count:
        template = TEMPLATES[i % len(TEMPLATES)]
        rng = random.Random(f"{seed}:{i}")
        i += 1
        topic, question, answer = template(rng)
        if question in seen:
            continue
        seen.add(question)
        problems.append(
            {"id": f"{template.__name__}-{len(problems)}", "topic": topic, "question": question, "answer": fmt(answer)}
        )
    return problems


def render(problems: list[dict[str, str]]) -> str:
    return "".join(json.dumps(p, sort_keys=True) + "\n" for p in problems)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--output", type=Path, default=DATA_FILE)
    parser.add_argument("--check", action="store_true", help="only compare with the existing file")
    args = parser.parse_args(argv)
    text = render(generate(args.count, args.seed))
    if args.check:
        same = args.output.exists() and args.output.read_text() == text
        print("up to date" if same else f"{args.output} is stale: regenerate it")
        return 0 if same else 1
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.count} problems to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
