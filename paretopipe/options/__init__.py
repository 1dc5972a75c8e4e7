"""The option catalogue: every option that several commands take, declared once (``flags``), with
its value type, default, choices and help; the commands' parsers (``cli``) and the stage
processes' command lines (``controller``) add it from its row."""
