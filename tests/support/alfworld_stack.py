"""ALFWorld's own engine stack, as AgentGym's ALFWorld server runs a game: alfworld's
AlfredTWEnv.init_env registers the game file with textworld.gym, wrapped in alfworld's
AlfredDemangler (no shuffling outside training) and AlfredInfos, asking for `won` and
`admissible_commands`, with TextWorld's step limit at AgentGym's 50
(WooooDyy/AgentGym: agentenv-alfworld/agentenv_alfworld/env_wrapper.py, configs/base_config.yaml).
Raw text: AgentGym's edits are the test's to re-express.

`expert=True` adds alfworld's AlfredExpert wrapper (handcoded type), as AlfredTWEnv.init_env
does for DAgger training (alfworld 0.4.2: alfworld/agents/environment/alfred_tw_env.py): each
answer then carries ALFWorld's handcoded expert's next command (`extra.expert_plan`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

AGENTGYM_STEP_LIMIT = 50


@dataclass(frozen=True)
class Step:
    text: str
    admissible: list[str]
    won: bool
    done: bool
    expert_plan: tuple[str, ...] = ()


class AlfWorldStack:
    def __init__(self, game_folder: Path, max_episode_steps: int = AGENTGYM_STEP_LIMIT, expert: bool = False) -> None:
        import textworld
        import textworld.gym
        from alfworld.agents.environment.alfred_tw_env import (AlfredDemangler, AlfredExpert, AlfredExpertType,
                                                               AlfredInfos)

        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        wrappers: list[Any] = [AlfredDemangler(shuffle=False), AlfredInfos]
        if expert:
            wrappers.append(AlfredExpert(expert_type=AlfredExpertType.HANDCODED))
            infos.extras.append("expert_plan")
        env_id = textworld.gym.register_games([str(game_folder / "game.tw-pddl")], infos, batch_size=1,
                                              asynchronous=False, max_episode_steps=max_episode_steps,
                                              wrappers=wrappers)
        self.env: Any = textworld.gym.make(env_id)

    def reset(self) -> Step:
        obs, info = self.env.reset()
        return Step(obs[0], list(info["admissible_commands"][0]), bool(info["won"][0]), False, _plan(info))

    def step(self, command: str) -> Step:
        obs, _, dones, info = self.env.step([command])
        return Step(obs[0], list(info["admissible_commands"][0]), bool(info["won"][0]), bool(dones[0]), _plan(info))

    def close(self) -> None:
        self.env.close()


def _plan(info: dict[str, Any]) -> tuple[str, ...]:
    return tuple(info["extra.expert_plan"][0]) if "extra.expert_plan" in info else ()
