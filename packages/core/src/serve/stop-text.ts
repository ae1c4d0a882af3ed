/**
 * Streaming text with stop strings: text that might be the start of a stop string is held back
 * until it is known not to be; once a stop string appears, the text is cut before it (OpenAI
 * semantics: the stop string is not returned).
 */
export class StopTextBuffer {
  private text = '';
  private sent = 0;
  private stoppedAt: number | undefined;
  /** Stop strings are searched from here (text before it was pushed before {@link arm}). */
  private searchFrom = 0;

  /**
   * @param armed false: stop strings are not searched (and no text is held back) until {@link arm} — vLLM's
   *   `min_tokens`, before which stop strings do not count.
   */
  constructor(
    private readonly stops: readonly string[],
    private armed = true,
  ) {}

  /** Searches stop strings from now on, in the text pushed after this call (no effect when armed). */
  arm(): void {
    if (this.armed) return;
    this.armed = true;
    this.searchFrom = this.text.length;
  }

  /** True once a stop string has appeared. */
  get stopped(): boolean {
    return this.stoppedAt !== undefined;
  }

  /** Adds decoded text. @returns the text that is safe to send now. */
  push(delta: string): string {
    if (this.stoppedAt !== undefined) return '';
    this.text += delta;
    if (!this.armed) return this.take(this.text.length);
    let cut = -1;
    for (const s of this.stops) {
      const i = this.text.indexOf(s, Math.max(this.searchFrom, this.sent - s.length + 1));
      if (i >= 0 && (cut < 0 || i < cut)) cut = i;
    }
    if (cut >= 0) {
      this.stoppedAt = cut;
      return this.take(cut);
    }
    let hold = 0;
    for (const s of this.stops) {
      for (let k = Math.min(s.length - 1, this.text.length); k > hold; k--) {
        if (this.text.endsWith(s.slice(0, k))) {
          hold = k;
          break;
        }
      }
    }
    return this.take(this.text.length - hold);
  }

  /** The end of the stream. @returns what is left to send. */
  finish(): string {
    return this.take(this.stoppedAt ?? this.text.length);
  }

  /** Everything sent or to send (cut before a stop string). */
  get fullText(): string {
    return this.text.slice(0, this.stoppedAt ?? this.text.length);
  }

  private take(end: number): string {
    if (end <= this.sent) return '';
    const out = this.text.slice(this.sent, end);
    this.sent = end;
    return out;
  }
}
