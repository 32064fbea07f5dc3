"""Lark grammars for ucf statements and schedules (shipped inside the wheel)."""
