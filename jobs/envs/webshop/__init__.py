"""WebShop (Yao et al., 2022) in process: a catalogue, BM25 search, pages, and WebShop's reward.

Modules: `catalog` (products and goals, read from WebShop's own data files), `generate` (a seeded
synthetic catalogue in those formats), `search` (BM25), `reward` (WebShop's get_reward),
`pages` (page state, text and clicks, actions read as WebShop reads them), `html_text` (how
WebShop's HTML-to-text shows a field), `queries` (listed search actions), `gold` (an expert's
path), `env` (the SyncEnv), `agentgym` (AgentGym's WebShop shapes for the env server).
Rules: docs/envs/webshop.md.
"""
