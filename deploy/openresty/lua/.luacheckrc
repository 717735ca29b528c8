-- luacheck's settings for the engine's modules: `make lua-test` runs
-- `luacheck .` from this directory before busted and fails on any
-- warning. The modules run in nginx's lua module (std ngx_lua); the
-- specs run under busted and stub ngx's fields.
std = "ngx_lua"
max_line_length = 140
self = false

-- Each metric's help text is one line of the exposition, kept on one
-- line of source.
files["router_metrics.lua"] = { max_line_length = false }

-- Specs: busted's globals, ngx stubbed (ngx.now, ngx.sleep), answers
-- quoted whole as test data.
files["spec/"] = { std = "ngx_lua+busted", globals = { "ngx" }, max_line_length = false }
