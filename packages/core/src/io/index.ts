/** @specd/core io: checkpoint weights (safetensors), HF config.json, tokenizers. */
export {
  SAFETENSORS_DTYPES,
  SAFETENSORS_MAX_HEADER_BYTES,
  SafetensorsError,
  dtypeBits,
  dtypeViewBytes,
  isSafetensorsDtype,
  type SafetensorsDtype,
  type SafetensorsHeader,
  type SafetensorsRule,
  type TensorData,
  type TensorInfo,
  type TypedArrayFor,
} from './safetensors-format.js';
export { SafetensorsFile, type LoadedTensor } from './safetensors.js';
export {
  SAFETENSORS_INDEX_FILE,
  SAFETENSORS_SINGLE_FILE,
  SafetensorsCheckpoint,
  readSafetensorsIndex,
  type SafetensorsIndex,
} from './safetensors-checkpoint.js';
export {
  serializeSafetensors,
  writeSafetensors,
  type TensorToWrite,
  type TensorsToWrite,
} from './safetensors-writer.js';
export { HfConfig, HfConfigError, type NumberBounds } from './hf-config.js';
export {
  Tokenizer,
  TokenizerError,
  type DecodeOptions,
  type EncodeOptions,
  type TokenizerSources,
} from './tokenizer.js';
export { IncrementalDetokenizer, type IncrementalDetokenizerOptions } from './detokenizer.js';
export {
  StrictJsonError,
  isJsonObject,
  parseStrictJson,
  type JsonObject,
  type JsonValue,
  type StrictJsonOptions,
} from './strict-json.js';
export {
  CHECKPOINT_SANITY_MODES,
  CheckpointSanity,
  CheckpointSanityError,
  findNonFinite,
  type CheckpointSanityMode,
  type CheckpointSanityOptions,
  type NonFiniteReport,
} from './checkpoint-sanity.js';
export { WeightReader, type MatrixBlock, type TensorRead, type WeightReaderOptions } from './weight-reader.js';
export {
  GGUF_DEFAULT_ALIGNMENT,
  GGUF_MAX_ARRAY_DEPTH,
  GGUF_MAX_DIMS,
  GGUF_SUPPORTED_TYPES,
  GgmlType,
  GgufError,
  GgufValueType,
  ggmlBlockSize,
  ggmlTypeName,
  isSupportedGgmlType,
  type GgufArrayValue,
  type GgufHeader,
  type GgufMetadataEntry,
  type GgufRule,
  type GgufTensorInfo,
  type GgufValue,
} from './gguf-types.js';
export { parseGguf } from './gguf-format.js';
export { GGUF_MAX_IN_MEMORY_BYTES, GgufFile } from './gguf.js';
export { bf16ToF32, dequantize, dequantizeRow, f16ToF32, f32ToF16, type GgufTensorView } from './gguf-dequant.js';
export { quantizeQ8_0 } from './gguf-quant.js';
export { GGUF_TOKEN_TYPE, PRE_TOKENIZERS, ggufTokenizerSources, tokenizerFromGguf } from './gguf-tokenizer.js';
