"""ALFWorld (ALFRED's household tasks as TextWorld PDDL games) as a thicket env family.

Modules: `names` (THOR ids to PDDL names to the names the player reads), `wording` (the
2.1.1 / 2.1.2 domain and grammar), `scenes` (rooms from the layouts the alfworld wheel
ships), `tasks` (task index -> generated game and its gold path), `cache` (games on
disk, checked by play), `engine` (a loaded game: step, snapshot, restore), `official`
(ALFWorld's own game files when the user has them), `presentation` (ALFWorld's raw text or
AgentGym's edits), `env` (the SyncEnv, registered), `agentgym` (AgentGym's server shapes).
"""
