// Package llmsim is a simulated vLLM-like LLM backend and a small load
// client, for the tests, the demo and the benchmark of the nginx/lua
// routing engine. It imports only the standard library.
//
// A Pod is an HTTP server speaking a subset of the OpenAI API
// (/v1/chat/completions, /v1/completions, a minimal /v1/responses,
// /v1/models and /health). It generates no language: an answer of n
// tokens is the deterministic text "tok0 tok1 … tok<n-1> " (each token
// "tokN "), so a client can send it back as the assistant message of the
// next turn. What it does simulate is the timing that makes routing
// matter:
//
//   - Time to first token is Config.BaseTTFT plus the prompt tokens that
//     are not in the pod's prefix cache divided by
//     Config.PrefillTokensPerSecond. Nothing of the response (not even the
//     headers) is written before it, as with vLLM.
//   - Decoding shares Config.DecodeTokensPerSecond equally among the
//     streams decoding at the moment: before each token after the first, a
//     stream waits k/capacity seconds, k being the number of streams then
//     past their first token and not finished.
//   - The prefix cache is an LRU set of hashes of message prefixes, per
//     pod. After a chat request the pod caches every prefix of the
//     messages plus the answer it generated, so the next turn of the same
//     conversation is cheap on that pod only. /v1/completions caches the
//     prompt, and the prompt followed by the answer, at 256-byte
//     boundaries; /v1/responses remembers each response's chain, so
//     previous_response_id is cheap on the pod that answered it.
//
// A text's token count is ceil(len(bytes)/4), at least 1 for a non-empty
// text; a chat prompt's count is the sum of its messages' contents
// (roles and template overhead count nothing).
//
// Every response carries the header X-Sim-Pod with the pod's name; a
// generated answer also carries X-Sim-Cached-Tokens, the prompt tokens
// the request found in the cache.
//
// The client side is Chat (and Complete): one request, streamed and
// parsed as Server-Sent Events as they arrive, measured into a Result
// (time to first token, decode rate, the pod that answered). Conversation
// builds the requests of a multi-turn chat, and Percentile and
// PercentileFloat summarize the measurements.
package llmsim
