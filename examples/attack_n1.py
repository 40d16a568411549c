"""Operator vs attacker on tso-case14-n1: co-evolve a dispatch policy against a population of attack plans
that trip two lines a day, then compare the operator's robustness to the evolved attack with its
robustness to random line trips on the test days.

    .venv/bin/python examples/attack_n1.py                     # about 15 s on a 2-core CPU
    .venv/bin/python examples/attack_n1.py --generations 20

"Damage" is the operator's overload plus balance shortfall (p.u. summed over the day's steps).
"""
import argparse

from evogrid.workflows import AttackConfig, AttackWorkflow


def main(generations: int = 100):
    wf = AttackWorkflow(AttackConfig(task="tso-case14-n1", pop_size=32, budget=2, attack_steps=8, seed=0))
    state = wf.init()
    before = wf.evaluate(state)
    state, history = wf.learn(state, generations, progress=False)
    after = wf.evaluate(state)
    print(f"tso-case14-n1, {generations} generations, population {wf.config.pop_size} per side; test days "
          f"(damage: overload + shortfall, p.u. x steps per day; return: -k$ per day)")
    print(f"| {'scenario':<36} | {'return':>9} | {'damage':>8} |")
    print(f"|{'-' * 38}|{'-' * 11}|{'-' * 10}|")
    for label, ev, attack in (("untrained operator", before, "initial attack"), ("co-evolved operator", after, "evolved attack")):
        print(f"| {label + ', no outage':<36} | {float(ev['return_no_attack']):>9.2f} | {float(ev['damage_no_attack']):>8.3f} |")
        print(f"| {label + ', random trips':<36} | {float(ev['return_random_attack']):>9.2f} | {float(ev['damage_random_attack']):>8.3f} |")
        print(f"| {label + ', ' + attack:<36} | {float(ev['return_evolved_attack']):>9.2f} | {float(ev['damage_evolved_attack']):>8.3f} |")
    line = int(after["attack_lines"][0])
    print(f"evolved attack trips branch {line}; its damage is {float(after['damage_evolved_attack']) / max(float(after['damage_random_attack']), 1e-9):.1f}x "
          f"that of a random trip (worst of {wf.config.random_attacks} random trips per day: {float(after['damage_random_attack_worst']):.3f})")
    print(f"attacker's mean damage over training: first 10 generations {sum(r['damage_mean'] for r in history[:10]) / 10:.3f}, "
          f"last 10 {sum(r['damage_mean'] for r in history[-10:]) / 10:.3f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--generations", type=int, default=100)
    main(ap.parse_args().generations)
