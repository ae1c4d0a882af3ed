// A bench's drafter name with an optional setting suffix, `name:variant` (bench:spec, bench:load): the folder
// models/<target>-<name>, loaded with the variant's drafter settings.
//   packed  DFlash draft_head "packed" (a drafter-owned copy of the target lm_head)
//   whole   draft_vocab "whole" (the whole vocabulary although the checkpoint lists a reduced one)
//   bf16    weights "bf16" (the draft model as the checkpoint stores it)
//   q8_0    weights "q8_0"
//   noconf  DFlash's or DSpark's confidence false (every proposed draft verified)
import * as path from 'node:path';

const VARIANTS = {
  packed: { draft_head: 'packed' },
  whole: { draft_vocab: 'whole' },
  bf16: { weights: 'bf16' },
  q8_0: { weights: 'q8_0' },
  noconf: { confidence: false },
};

/**
 * What loadDrafter takes for `name[:variant]` of target folder `targetDir` under `modelsDir`: the folder path, or
 * { dir, settings } with a variant. @throws Error naming an unknown variant.
 */
export function drafterSource(modelsDir, targetDir, name) {
  const [base, variant] = name.split(':');
  const dir = path.join(modelsDir, `${targetDir}-${base}`);
  if (variant === undefined) return dir;
  const settings = VARIANTS[variant];
  if (settings === undefined)
    throw new Error(`${name}: unknown variant "${variant}" (expected one of ${Object.keys(VARIANTS).join(', ')})`);
  return { dir, settings };
}

/** The folder of `name[:variant]` (for existence checks). */
export const drafterDir = (modelsDir, targetDir, name) => path.join(modelsDir, `${targetDir}-${name.split(':')[0]}`);
