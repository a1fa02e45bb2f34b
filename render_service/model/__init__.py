"""The served model, as both directions use it: loading (tokenizer, template, config), prompt
tokenization, chat templates and their sandbox, the embedded default model, and the setup of the
model's reasoning and tool-call parsers."""
