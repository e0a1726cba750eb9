"""The `ask` session's program: one question to the model, through the daemon's
gateway. The official Anthropic client reads ANTHROPIC_BASE_URL and
ANTHROPIC_API_KEY from the environment, which the daemon set to its gateway's
address for this run and the run's own token: no provider key is here, and the
call is recorded in the session's log (model.requested, model.responded)."""

import anthropic

reply = anthropic.Anthropic().messages.create(
    model="scripted-model",
    max_tokens=200,
    messages=[{"role": "user", "content": "Say hello to the make run tour."}],
)
print(reply.content[0].text)
