"""How ALFWorld's text reaches the agent: as ALFWorld's engine writes it (`alfworld`, the
default), or as AgentGym's ALFWorld server passes it on (`agentgym`).

AgentGym's server (WooooDyy/AgentGym, agentenv-alfworld/agentenv_alfworld/env_wrapper.py and
utils.py) changes ALFWorld's text in three places, re-expressed here:
- the opening loses its first paragraph (the "-= Welcome to TextWorld, ALFRED! =-" header),
  and its remaining paragraphs are joined by one newline instead of a blank line;
- a step's text that starts "You arrive at loc " loses everything up to and including the
  first ". " (the location line: "You arrive at loc 12. The cabinet 1 is closed." reads
  "The cabinet 1 is closed.");
- a step that ends the episode (won, or at the step limit) still lists the admissible
  commands (thicket's default lists none once the episode is over).
"""

from __future__ import annotations

from enum import StrEnum


class Presentation(StrEnum):
    ALFWORLD = "alfworld"
    AGENTGYM = "agentgym"


ARRIVAL = "You arrive at loc "


def opening(text: str, presentation: Presentation) -> str:
    if presentation is Presentation.ALFWORLD:
        return text
    return "\n".join(text.split("\n\n")[1:])


def step_text(text: str, presentation: Presentation) -> str:
    if presentation is Presentation.ALFWORLD or not text.startswith(ARRIVAL):
        return text
    _, sep, rest = text.partition(". ")
    return rest if sep else text


def lists_actions_at_the_end(presentation: Presentation) -> bool:
    return presentation is Presentation.AGENTGYM
