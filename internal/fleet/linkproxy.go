package fleet

import (
	"fmt"
	"io"
	"net"
	"sync"
)

// LinkProxy is a TCP proxy between a site's leaf node and the hub's leaf
// port that the bench controls, as the e2e test's cut does: Cut closes
// every connection and refuses new ones, so the link is down while both
// servers and the site's own clients stay up; Heal listens again on the
// same address, and the leaf node's reconnect finds the hub. With
// FromTarget it also rewrites what the target sends (sitetest.OlderServer).
type LinkProxy struct {
	addr, target string
	fromTarget   func(dst io.Writer, src io.Reader) error

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
}

// LinkOption changes what a LinkProxy forwards.
type LinkOption func(*LinkProxy)

// FromTarget has the proxy pass what the target sends through forward, which
// writes to dst what it reads from src until either fails, instead of
// copying it as it is: a test's way to make a server say what it does not.
func FromTarget(forward func(dst io.Writer, src io.Reader) error) LinkOption {
	return func(p *LinkProxy) { p.fromTarget = forward }
}

// StartLinkProxy listens on a free local port and forwards each connection
// to target.
func StartLinkProxy(target string, opts ...LinkOption) (*LinkProxy, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	p := &LinkProxy{addr: fmt.Sprintf("127.0.0.1:%d", port), target: target, fromTarget: copyAsIs, conns: map[net.Conn]bool{}}
	for _, o := range opts {
		o(p)
	}
	return p, p.Heal()
}

// copyAsIs is what a LinkProxy does with each direction by default.
func copyAsIs(dst io.Writer, src io.Reader) error {
	_, err := io.Copy(dst, src)
	return err
}

// Addr is where the leaf node connects.
func (p *LinkProxy) Addr() string { return p.addr }

// Heal listens again and forwards what connects.
func (p *LinkProxy) Heal() error {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("link proxy: listen on %s again: %w", p.addr, err)
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go p.accept(ln)
	return nil
}

func (p *LinkProxy) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.ln != ln {
			// Cut while this one was dialling: it must not outlive the cut.
			p.mu.Unlock()
			c.Close()
			up.Close()
			continue
		}
		p.conns[c], p.conns[up] = true, true
		p.mu.Unlock()
		go p.pipe(up, c, copyAsIs)
		go p.pipe(c, up, p.fromTarget)
	}
}

// pipe forwards src to dst through forward; when either direction ends, both
// connections close.
func (p *LinkProxy) pipe(dst, src net.Conn, forward func(dst io.Writer, src io.Reader) error) {
	_ = forward(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Cut closes every connection and stops listening.
func (p *LinkProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}
