package readiness

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync"
)

// table is one /proc/net/tcp* file.
type table struct {
	path          string
	absentIsEmpty bool
}

// readerPool reuses the 64 KiB line buffers between scans: a busy proxy's
// tables run to hundreds of thousands of rows, and a scan happens about
// once per TTL for as long as the process lives.
var readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}

// scan returns which bits of want (restricted to need) have a LISTEN row.
// It stops reading once every needed port is found; with need == 0 it only
// checks that the table opens and has the expected header.
func (t table) scan(want map[uint16]uint32, need uint32) (uint32, error) {
	f, err := openTable(t.path)
	if err != nil {
		if t.absentIsEmpty && errors.Is(err, fs.ErrNotExist) {
			return 0, nil
		}
		return 0, err
	}
	defer f.Close()
	br := readerPool.Get().(*bufio.Reader)
	br.Reset(f)
	defer func() {
		br.Reset(nil)
		readerPool.Put(br)
	}()
	return scanRows(br, want, need)
}

// scanRows parses a table in the kernel's format (net/ipv4/tcp_ipv4.c and
// net/ipv6/tcp_ipv6.c):
//
//	sl  local_address rem_address   st tx_queue ...
//	 0: 00000000:3AA0 00000000:0000 0A 00000000:00000000 ...
//
// The local address is field 1 and the state field 3; the port is the hex
// after the last colon (tcp6 addresses are 32 hex digits). Only state 0A
// (TCP_LISTEN) counts.
func scanRows(br *bufio.Reader, want map[uint16]uint32, need uint32) (uint32, error) {
	header, err := readLine(br)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return 0, errors.New("empty table, expected a header line")
		}
		return 0, err
	}
	if err := checkHeader(header); err != nil {
		return 0, err
	}
	var found uint32
	for lineNo := 2; need&^found != 0; lineNo++ {
		line, err := readLine(br)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, err
		}
		port, listen, err := parseRow(line)
		if err != nil {
			return 0, fmt.Errorf("line %d: %w", lineNo, err)
		}
		if listen {
			found |= want[port] & need
		}
	}
	return found, nil
}

// readLine returns the next line without its newline, io.EOF at the end.
// The slice is only valid until the next call.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	switch {
	case err == nil:
		return line[:len(line)-1], nil
	case errors.Is(err, io.EOF) && len(line) > 0:
		return line, nil // last line without a newline
	case errors.Is(err, bufio.ErrBufferFull):
		return nil, fmt.Errorf("line longer than %d bytes", br.Size())
	}
	return nil, err
}

// checkHeader accepts the tcp and tcp6 headers ("rem_address" and
// "remote_address" differ, so field 2 is not checked).
func checkHeader(line []byte) error {
	f := bytes.Fields(line)
	if len(f) < 4 || string(f[0]) != "sl" || string(f[1]) != "local_address" || string(f[3]) != "st" {
		return fmt.Errorf("unexpected header %q, want \"sl local_address ... st ...\"", truncate(line, 80))
	}
	return nil
}

// parseRow extracts the local port and whether the row is a listener. It
// avoids allocating: tables can be large and this runs for every row. The
// port of a non-listening row is not validated beyond the field count.
func parseRow(line []byte) (port uint16, listen bool, err error) {
	var fields [4][]byte
	i := 0
	for n := range fields {
		for i < len(line) && line[i] == ' ' {
			i++
		}
		j := i
		for j < len(line) && line[j] != ' ' {
			j++
		}
		if j == i {
			if n == 0 {
				return 0, false, nil // blank line
			}
			return 0, false, fmt.Errorf("%d fields, want at least 4: %q", n, truncate(line, 80))
		}
		fields[n] = line[i:j]
		i = j
	}
	st := fields[3]
	if len(st) != 2 || !isHex(st[0]) || !isHex(st[1]) {
		return 0, false, fmt.Errorf("state %q is not two hex digits", st)
	}
	if st[0] != '0' || (st[1] != 'A' && st[1] != 'a') {
		return 0, false, nil
	}
	local := fields[1]
	colon := bytes.LastIndexByte(local, ':')
	if colon < 0 || (colon != 8 && colon != 32) {
		return 0, false, fmt.Errorf("local address %q is not 8 or 32 hex digits, a colon and a port", local)
	}
	hex := local[colon+1:]
	if len(hex) == 0 || len(hex) > 4 {
		return 0, false, fmt.Errorf("local port %q is not 1-4 hex digits", hex)
	}
	var p uint16
	for _, c := range hex {
		v, ok := hexVal(c)
		if !ok {
			return 0, false, fmt.Errorf("local port %q is not hex", hex)
		}
		p = p<<4 | uint16(v)
	}
	return p, true, nil
}

func isHex(c byte) bool { _, ok := hexVal(c); return ok }

func hexVal(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}
