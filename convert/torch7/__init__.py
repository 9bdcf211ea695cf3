"""The Torch7 frontend: .t7 reader, sandboxed Lua definitions, module mapping."""
