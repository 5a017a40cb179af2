"""Self-play league: the opponent pool (OpenAI Five) and ratings (TrueSkill, Elo, Nash averaging)."""
