-- How a run's prompts reached the model (specfleet/settings.py, record schema 4): prompt_format
-- (chat through the model's chat template, or raw text), the chat's system prompt, and the
-- template's reasoning switch (on | off; NULL where the template has none). Runs stored before
-- recorded none of them: NULL (unknown; they were raw text).
ALTER TABLE runs ADD COLUMN prompt_format VARCHAR;
ALTER TABLE runs ADD COLUMN system_prompt VARCHAR;
ALTER TABLE runs ADD COLUMN reasoning VARCHAR;
