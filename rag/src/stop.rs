//! Stop strings: an answer ends before the first of them. Streamed text is held back while
//! its end could still grow into one, so no piece of a stop string ever reaches the client.

/// Cuts a stream of text deltas at the first stop string.
#[derive(Debug)]
pub struct StopStrings<'a> {
    stops: &'a [String],
    /// Text received but not yet released: it may be the start of a stop string.
    held: String,
    stopped: bool,
}

impl<'a> StopStrings<'a> {
    pub fn new(stops: &'a [String]) -> Self {
        Self {
            stops,
            held: String::new(),
            stopped: false,
        }
    }

    /// Whether a stop string has been reached (nothing more is released).
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Takes the next delta and returns the text that can be released now.
    pub fn push(&mut self, delta: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.held.push_str(delta);
        if let Some(at) = first_stop(&self.held, self.stops) {
            self.stopped = true;
            let released = self.held[..at].to_string();
            self.held.clear();
            return released;
        }
        let keep = self.longest_partial_stop();
        let release_to = self.held.len() - keep;
        let released = self.held[..release_to].to_string();
        self.held.drain(..release_to);
        released
    }

    /// The text still held when the stream ended without reaching a stop string.
    pub fn finish(self) -> String {
        self.held
    }

    /// Bytes at the end of the held text that a stop string starts with.
    fn longest_partial_stop(&self) -> usize {
        self.stops
            .iter()
            .flat_map(|stop| {
                (1..stop.len())
                    .rev()
                    .filter(|&n| stop.is_char_boundary(n))
                    .find(|&n| self.held.ends_with(&stop[..n]))
            })
            .max()
            .unwrap_or(0)
    }
}

/// `text` up to the first stop string, and whether one was found.
pub fn cut_at_stop<'t>(text: &'t str, stops: &[String]) -> (&'t str, bool) {
    match first_stop(text, stops) {
        Some(at) => (&text[..at], true),
        None => (text, false),
    }
}

/// Where the earliest stop string starts in `text`.
fn first_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter(|stop| !stop.is_empty())
        .filter_map(|stop| text.find(stop.as_str()))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(deltas: &[&str], stops: &[&str]) -> (Vec<String>, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut matcher = StopStrings::new(&stops);
        let mut out: Vec<String> = deltas.iter().map(|d| matcher.push(d)).collect();
        let stopped = matcher.stopped();
        out.push(matcher.finish());
        (out, stopped)
    }

    #[test]
    fn a_stop_string_split_across_deltas_is_never_released() {
        let (out, stopped) = stream(&["Paris", " is", " the", " EN", "D here"], &["END"]);
        assert!(stopped);
        assert_eq!(out.concat(), "Paris is the ");
        assert!(out.iter().all(|piece| !piece.contains('E')), "{out:?}");
    }

    #[test]
    fn held_text_that_does_not_become_a_stop_string_is_released() {
        let (out, stopped) = stream(&["a\n", "\nb", "c\n"], &["\n\n\n"]);
        assert!(!stopped);
        assert_eq!(out.concat(), "a\n\nbc\n");
        assert_eq!(
            out[0], "a",
            "the newline waits: it may start the stop string"
        );
    }

    #[test]
    fn the_earliest_of_several_stop_strings_ends_the_text() {
        assert_eq!(
            cut_at_stop("one. two! three", &["!".into(), ".".into()]),
            ("one", true)
        );
        assert_eq!(cut_at_stop("no stop", &["?".into()]), ("no stop", false));
        let (out, _) = stream(&["héllo wörld"], &["wö"]);
        assert_eq!(out.concat(), "héllo ");
    }
}
