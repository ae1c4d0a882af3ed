// Core never branches on a drafting method: outside comments, no source file under packages/core/src
// names DFlash, DSpark or EAGLE, except the shipped defaults listed in ALLOWED (each entry: where, which
// line, why). A new use anywhere else fails this test with its file and line.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

import { describe, expect, it } from 'vitest';

const SRC = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../src');
const METHOD_NAME = /dflash|dspark|eagle/i;

/** One allowed use: a path under packages/core/src (regex) and the code line itself (regex, comments removed). */
interface Allowed {
  readonly why: string;
  readonly file: RegExp;
  readonly line: RegExp;
  /** The line must also lie inside the block that starts at a line matching this and ends at the next `]`/`])`. */
  readonly insideBlock?: RegExp;
}

// Keyed on the symbol or text, not only the file, so the lines may move between cli/, runtime/ and plugin/.
const ALLOWED: readonly Allowed[] = [
  {
    why: 'the default plugin packages (BUILTIN_PLUGIN_PACKAGES), loaded when a config names none',
    file: /^(plugin|runtime)\/[\w-]+\.ts$/,
    line: /^\s*'@specd\/plugin-(dflash|dspark|eagle3)',$/,
    insideBlock: /\bBUILTIN_PLUGIN_PACKAGES\b.*=/,
  },
  {
    why: 'the default drafter of the default target (DEFAULT_DRAFTER_RELATIVE)',
    file: /^(cli|runtime)\/[\w-]+\.ts$/,
    line: /^export const DEFAULT_DRAFTER_RELATIVE = 'models\/kimi-k3-tiny-dflash';$/,
  },
  {
    why: 'CLI help of `specd generate` / `specd serve` naming the shipped default drafter',
    file: /^cli\/[\w-]+\.ts$/,
    line: /^\s*\.description\('[^']*\(default: the shipped (target \+ )?DFlash\b[^']*\)'\)$/,
  },
  {
    why: 'CLI help of --drafter naming the shipped default drafter folder',
    file: /^cli\/[\w-]+\.ts$/,
    line: /^\s*'drafter checkpoint directory \(default with the default model: models\/kimi-k3-tiny-dflash\)',$/,
  },
  {
    why: 'config schema description of `drafter` naming the shipped default',
    file: /^config\/schema\.ts$/,
    line: /^\s*description: '[^']*absent: the shipped DFlash with the shipped target, else none',$/,
  },
];

/**
 * `source` with every comment (`// …`, `/* … *\/`) replaced by spaces, newlines kept; string, template
 * and regular-expression literals are kept as they are (a method name in a string is code).
 */
function stripComments(source: string): string {
  let out = '';
  let i = 0;
  // Template literals nest through `${ … }`: each entry counts the open braces of one `${`.
  const templateBraces: number[] = [];
  let lastSignificant = '';
  const blank = (text: string): string => text.replace(/[^\n]/g, ' ');
  const readQuoted = (quote: string): void => {
    const start = i;
    i += 1;
    while (i < source.length && source[i] !== quote && source[i] !== '\n') i += source[i] === '\\' ? 2 : 1;
    i += 1;
    out += source.slice(start, i);
  };
  const readTemplate = (): void => {
    // From just after a backtick or a closing `}` of `${`, to the closing backtick or the next `${`.
    const start = i;
    while (i < source.length) {
      if (source[i] === '\\') i += 2;
      else if (source[i] === '`') {
        i += 1;
        break;
      } else if (source[i] === '$' && source[i + 1] === '{') {
        i += 2;
        templateBraces.push(0);
        break;
      } else i += 1;
    }
    out += source.slice(start, i);
  };
  while (i < source.length) {
    const c = source[i] ?? '';
    const next = source[i + 1] ?? '';
    if (c === '/' && next === '/') {
      const end = source.indexOf('\n', i);
      const stop = end === -1 ? source.length : end;
      out += blank(source.slice(i, stop));
      i = stop;
    } else if (c === '/' && next === '*') {
      const end = source.indexOf('*/', i + 2);
      const stop = end === -1 ? source.length : end + 2;
      out += blank(source.slice(i, stop));
      i = stop;
    } else if (c === "'" || c === '"') {
      readQuoted(c);
      lastSignificant = c;
    } else if (c === '`') {
      out += c;
      i += 1;
      readTemplate();
      lastSignificant = '`';
    } else if (c === '/' && (lastSignificant === '' || /[(,=:[!&|?{};+\-*%<>~^]/.test(lastSignificant))) {
      // A regular-expression literal (a `/` where an operand starts): to the closing `/`, classes skipped.
      const start = i;
      let inClass = false;
      i += 1;
      while (i < source.length && source[i] !== '\n') {
        const r = source[i];
        if (r === '\\') i += 1;
        else if (r === '[') inClass = true;
        else if (r === ']') inClass = false;
        else if (r === '/' && !inClass) break;
        i += 1;
      }
      i += 1;
      out += source.slice(start, i);
      lastSignificant = '/';
    } else if (templateBraces.length > 0 && (c === '{' || c === '}')) {
      const depth = templateBraces.length - 1;
      if (c === '{') {
        templateBraces[depth] = (templateBraces[depth] ?? 0) + 1;
        out += c;
        i += 1;
      } else if ((templateBraces[depth] ?? 0) > 0) {
        templateBraces[depth] = (templateBraces[depth] ?? 0) - 1;
        out += c;
        i += 1;
      } else {
        templateBraces.pop();
        out += c;
        i += 1;
        readTemplate();
      }
      lastSignificant = c;
    } else {
      out += c;
      i += 1;
      if (!/\s/.test(c)) lastSignificant = /[\w$)\]]/.test(c) ? 'w' : c;
    }
  }
  return out;
}

function sourceFiles(dir = ''): string[] {
  const out: string[] = [];
  for (const entry of fs.readdirSync(path.join(SRC, dir), { withFileTypes: true })) {
    const rel = dir === '' ? entry.name : `${dir}/${entry.name}`;
    if (entry.isDirectory()) out.push(...sourceFiles(rel));
    else if (entry.isFile() && entry.name.endsWith('.ts')) out.push(rel);
  }
  return out.sort();
}

/** Whether line `index` of `lines` lies inside a block opened by a line matching `start` (up to its `]`). */
function insideBlock(lines: readonly string[], index: number, start: RegExp): boolean {
  for (let j = index; j >= 0; j--) {
    const text = lines[j] ?? '';
    if (start.test(text)) return true;
    if (j < index && /^\s*\]/.test(text)) return false;
  }
  return false;
}

describe('core names no drafting method', () => {
  it('strips comments and keeps strings, templates and regular expressions', () => {
    const open = ['$', '{'].join(''); // a template placeholder opener, spelt so that no string holds one
    const src = [
      "const a = 'x // not a comment'; // dflash",
      `/* eagle */ const b = \`t ${open}c /* dspark */ ? \`n\` : "m"} // kept\`;`,
      'const r = /[/"]/.test(s) ? 1 : 2; // gone',
      "const d = 'dspark';",
    ].join('\n');
    const stripped = stripComments(src);
    expect(stripped.split('\n')).toHaveLength(4);
    expect(stripped).toContain("'x // not a comment'");
    expect(stripped).toContain('// kept`');
    expect(stripped).toContain('/[/"]/.test(s)');
    expect(stripped).not.toMatch(/dflash|eagle|gone/);
    expect(stripped.split('\n')[1]).not.toContain('dspark');
    expect(stripped.split('\n')[3]).toContain("'dspark'");
  });

  it('finds no method name in packages/core/src outside comments and the allowed defaults', () => {
    const files = sourceFiles();
    expect(files.length).toBeGreaterThan(40);
    const violations: string[] = [];
    const used = new Set<Allowed>();
    for (const file of files) {
      const lines = stripComments(fs.readFileSync(path.join(SRC, file), 'utf8')).split('\n');
      lines.forEach((text, index) => {
        if (!METHOD_NAME.test(text)) return;
        const allowed = ALLOWED.find(
          (a) =>
            a.file.test(file) &&
            a.line.test(text) &&
            (a.insideBlock === undefined || insideBlock(lines, index, a.insideBlock)),
        );
        if (allowed === undefined) violations.push(`packages/core/src/${file}:${index + 1}: ${text.trim()}`);
        else used.add(allowed);
      });
    }
    expect(
      violations,
      `method names in core (move them to the plugin, or to ALLOWED if a default):\n${violations.join('\n')}`,
    ).toEqual([]);
    const stale = ALLOWED.filter((a) => !used.has(a)).map((a) => a.why);
    expect(stale, `ALLOWED entries that match nothing any more (remove or update them):\n${stale.join('\n')}`).toEqual(
      [],
    );
  });
});
