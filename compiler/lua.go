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
// "[[…]]" (they break nginx's parse and drop a leading newline).
func LuaString(s string) string {
	return string(appendLuaString(make([]byte, 0, len(s)+2), s))
}

func appendLuaString(b []byte, s string) []byte {
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
	return append(b, '"')
}
