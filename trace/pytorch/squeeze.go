package pytorch

import "io"

// squeezer passes a JSON stream through with every run of white space
// outside strings cut to its first byte. Both decoders read through it
// because encoding/json's Decoder keeps white space it skips between tokens
// in its buffer and scans it again on each refill: megabytes of blanks after
// "nodes": [ cost time quadratic in their length. One blank per run still
// separates what it separated, so the decoder accepts and refuses exactly
// what it would have.
type squeezer struct {
	r     io.Reader
	inStr bool // inside a string
	esc   bool // after a backslash inside a string
	space bool // the last byte passed on was white space outside a string
}

func newSqueezer(r io.Reader) *squeezer { return &squeezer{r: r} }

func (s *squeezer) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		n, err := s.r.Read(p)
		w := 0
		for _, c := range p[:n] {
			switch {
			case s.inStr:
				switch {
				case s.esc:
					s.esc = false
				case c == '\\':
					s.esc = true
				case c == '"':
					s.inStr = false
				}
			case c == ' ' || c == '\t' || c == '\n' || c == '\r':
				if s.space {
					continue
				}
				s.space = true
				p[w] = c
				w++
				continue
			case c == '"':
				s.inStr = true
			}
			s.space = false
			p[w] = c
			w++
		}
		if w > 0 || err != nil {
			return w, err
		}
	}
}
