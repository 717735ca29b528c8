-- router_affinity: the affinity key of an llm request (docs/lua-contract.md,
-- "Session affinity"), in this order:
--   1. the session header (the canary's sticky header, default
--      x-session-id);
--   2. the sticky cookie (default autoconfig-session);
--   3. the conversation's identity in the JSON body (router_body): the
--      first system and first user message of a chat request, the head of
--      a completions prompt, a Responses request's previous_response_id
--      (mapped back to the key its chain started with, when this nginx
--      served that response);
--   4. none: least load.
-- The body is read only for llm routes and only up to body_max bytes
-- (affinity_body_max_bytes, default 1 MiB); a larger body has no body key.
-- Only the key's hash places the request; the key never names a peer.
local state = require("router_state")
local body = require("router_body")

local num, clamp = state.num, state.clamp

local M = {}

-- Responses API: response id → the key its request was placed by, kept
-- this long (seconds) in the route's dict with safe_set (never evicting).
local CHAIN_TTL = 3600

-- config: the route's affinity settings from its options and canary.
function M.config(o, c)
  local header = (c and c.sticky_header) or "x-session-id"
  local cookie = (c and c.sticky_cookie) or "autoconfig-session"
  local hv = "http_" .. string.gsub(string.lower(header), "-", "_")
  return {
    on = o.affinity ~= "off",
    c = clamp(num(o.affinity_load_factor, 1.25), 1, 100),
    floor = clamp(math.floor(num(o.affinity_min_load, 6)), 0, 100000),
    body_max = clamp(math.floor(num(o.affinity_body_max_bytes, 1048576)), 0, 64 * 1048576),
    prompt_bytes = clamp(math.floor(num(o.affinity_prompt_bytes, 512)), 16, 65536),
    max_separators = clamp(math.floor(num(o.affinity_body_max_separators, body.DEFAULT_MAX_SEPARATORS)), 0, 1000000),
    header_var = hv, cookie_var = "cookie_" .. cookie,
  }
end

-- read_body: the request body as a string when it is at most max bytes,
-- else nil (also when the body is in a temporary file that cannot be
-- read).
local function read_body(max)
  local len = tonumber(ngx.var.http_content_length)
  if len and len > max then
    return nil
  end
  ngx.req.read_body()
  local data = ngx.req.get_body_data()
  if data then
    if #data > max then return nil end
    return data
  end
  local file = ngx.req.get_body_file()
  if not file then
    return nil
  end
  local f = io.open(file, "rb")
  if not f then
    return nil
  end
  data = f:read(max + 1)
  f:close()
  if data == nil or #data > max then
    return nil
  end
  return data
end

-- key: the request's affinity key (a string) and its source ("header",
-- "cookie", "chat", "completion", "response"), or nil.
function M.key(r)
  local a = r.aff
  local var = ngx.var
  local k = var[a.header_var]
  if k ~= nil and k ~= "" then
    return "h\0" .. k, "header"
  end
  k = var[a.cookie_var]
  if k ~= nil and k ~= "" then
    return "h\0" .. k, "cookie"
  end
  if ngx.req.get_method() ~= "POST" or a.body_max == 0 then
    return nil
  end
  local text = read_body(a.body_max)
  if not text or text == "" then
    return nil
  end
  local key, kind, prev = body.key(text, var.uri, a)
  if prev then
    -- A chain's key is that of its first request: the response it
    -- continues was placed by it.
    local chained = r.store:get("x|" .. prev)
    if chained then
      return chained, kind
    end
  end
  return key, kind
end

-- remember maps a Responses API response id to the key its request was
-- placed by (the next turn's previous_response_id).
function M.remember(r, id, key)
  if type(id) == "string" and id ~= "" and #id <= 256 and key then
    r.store:safe_set("x|" .. id, key, CHAIN_TTL)
  end
end

return M
