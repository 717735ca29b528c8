package compiler

// luaSafe marks the bytes a lua string literal may carry as themselves. Every
// other byte is written as a decimal escape "\ddd". The set is small on
// purpose: besides lua's own lexer, nginx's lexer reads the literal first
// (the code sits inside a *_by_lua_block {}), so quotes, '\', '{', '}', ';',
// '#', '$', '[', ']', newlines and every non-ASCII byte are escaped and can
// neither end the string, nor the block, nor start a long bracket or a
// comment.
var luaSafe = func() (t [256]bool) {
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range " _-.,:/@+=" {
		t[c] = true
	}
	return t
}()

// LuaString returns s as a double-quoted lua string literal that lua reads
// back as exactly the bytes of s (any bytes: NUL, invalid UTF-8, newlines,
// quotes, "]]"), and that is safe inside an nginx *_by_lua_block. Escapes are
// always three digits, so a following digit cannot extend them.
//
// strconv.Quote is not usable (lua rejects "\u"), nor are long brackets
// "[[…]]" (they break nginx's parse and drop a leading newline). A literal
// longer than maxLuaToken becomes a table.concat of shorter ones, so the
// result is then a lua expression rather than a single literal.
func LuaString(s string) string {
	return string(appendLuaString(make([]byte, 0, len(s)+2), s))
}

func appendLuaString(b []byte, s string) []byte {
	mark := len(b)
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if luaSafe[c] {
			continue
		}
		b = append(b, s[start:i]...)
		b = append(b, '\\', '0'+c/100, '0'+c/10%10, '0'+c%10)
		start = i + 1
	}
	b = append(b, s[start:]...)
	b = append(b, '"')
	if len(b)-mark <= maxLuaToken {
		return b
	}
	return appendLongLuaString(b[:mark], s)
}

// maxLuaToken bounds one string literal in a route file. nginx reads a
// *_by_lua_block token by token into its 4096-byte configuration buffer and
// refuses a longer one ("too long lua code block"); measured with Debian's
// lua module 0.10.23, a literal after another long one already fails above
// about 3000 bytes. Literals up to this size render as one token, as they
// always did; longer ones become pieces of at most luaPiece bytes.
const maxLuaToken = 2048

// luaPiece is the size of one piece of a long literal (one per line).
const luaPiece = 1024

// appendLongLuaString writes s as table.concat({"…",\n"…", …}): pieces of
// at most luaPiece bytes each, one per line, never splitting an escape. A table
// constructor, unlike a chain of "..", has no limit on its number of
// parts (lua flushes its items in batches).
func appendLongLuaString(b []byte, s string) []byte {
	b = append(b, "table.concat({"...)
	piece := len(b)
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		n := 1
		if !luaSafe[c] {
			n = 4
		}
		if len(b)-piece+n+1 > luaPiece {
			b = append(b, '"', ',', '\n')
			piece = len(b)
			b = append(b, '"')
		}
		if luaSafe[c] {
			b = append(b, c)
		} else {
			b = append(b, '\\', '0'+c/100, '0'+c/10%10, '0'+c%10)
		}
	}
	return append(b, '"', '}', ')')
}
